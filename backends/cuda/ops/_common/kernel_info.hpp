// One row of an op's kernels() table: a kernel candidate, its rank and the constraints under which it runs.
#pragma once
#include <string>

namespace ge2 {

struct KernelInfo {
  std::string name;
  int priority;  // higher is preferred among the candidates that support a problem
  std::string description;
  std::string constraints;
};

}  // namespace ge2
