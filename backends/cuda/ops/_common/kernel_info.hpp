// One row of an op's kernels() table: a kernel candidate, its rank and the constraints under which it runs. The
// Python selector (graph_executor_v2/selection.py) reads a candidate's priority, description, alignment and whether
// it is the fallback from here: they are written nowhere else.
#pragma once
#include <string>

namespace ge2 {

// KernelInfo::fallback: the candidate that runs every valid problem on the GPU.
constexpr bool kFallback = true;
// KernelInfo::alignment: the pointer alignment a kernel needs; kAnyAlignment takes views into other arrays.
constexpr int kVectorAlignment = 16;
constexpr int kAnyAlignment = 1;

struct KernelInfo {
  std::string name;
  int priority;  // higher is preferred among the candidates that support a problem
  std::string description;
  std::string constraints;
  bool fallback = false;
  int alignment = kVectorAlignment;  // a fallback takes any alignment whatever this says
};

}  // namespace ge2
