// One row of an op's kernels() table: a kernel candidate, its rank and the constraints under which it runs. The
// Python selector (graph_executor_v2/selection.py) reads a candidate's priority, description, alignment, dtypes and
// whether it is the fallback from here: they are written nowhere else. The selector is the only place that chooses
// a kernel; a native entry point runs the kernel it is named (after checking that it can run the problem).
#pragma once
#include <string>
#include <vector>

#include "dtype.hpp"

namespace ge2 {

// KernelInfo::fallback: the candidate that runs every valid problem on the GPU.
constexpr bool kFallback = true;
// KernelInfo::alignment: the pointer alignment a kernel needs; kAnyAlignment takes views into other arrays.
constexpr int kVectorAlignment = 16;
constexpr int kAnyAlignment = 1;

inline std::vector<DType> every_dtype() {
  return {DType::Float32,    DType::Float16,    DType::BFloat16, DType::Int32, DType::Int64,
          DType::UInt8,      DType::Float8E4M3, DType::Float8E5M2, DType::Bool};
}

inline std::vector<DType> floating_dtypes() { return {DType::Float32, DType::Float16, DType::BFloat16}; }

struct KernelInfo {
  std::string name;
  int priority;  // higher is preferred among the candidates that support a problem
  std::string description;
  std::string constraints;
  bool fallback = false;
  int alignment = kVectorAlignment;  // a fallback takes any alignment whatever this says
  // The dtypes of the op's data (its first input) the kernel runs: the selector declines a kernel for any other
  // before asking its native supports check.
  std::vector<DType> dtypes = every_dtype();
};

// `table` with every row running only `dtypes` (an op whose kernels share one dtype set).
inline std::vector<KernelInfo> with_dtypes(std::vector<KernelInfo> table, const std::vector<DType>& dtypes) {
  for (KernelInfo& row : table) row.dtypes = dtypes;
  return table;
}

}  // namespace ge2
