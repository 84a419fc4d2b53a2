// The kernel choice of the ops whose candidates are a 16-byte vectorized kernel and an element-by-element one that
// always works (dropout, embedding): the enum and its names, as kernel arguments and kernels() tables spell them.
// The Python selector (graph_executor_v2/selection.py) chooses between them; a call names one.
#pragma once
#include <stdexcept>
#include <string>

namespace ge2 {

enum class VecKernel { Vec16, Scalar };

inline VecKernel vec_kernel_from_name(const std::string& name) {
  if (name == "vec16") return VecKernel::Vec16;
  if (name == "scalar") return VecKernel::Scalar;
  throw std::invalid_argument("kernel: expected one of vec16, scalar, got '" + name + "'");
}

inline const char* vec_kernel_name(VecKernel kernel) {
  switch (kernel) {
    case VecKernel::Vec16: return "vec16";
    case VecKernel::Scalar: return "scalar";
  }
  return "unknown";
}

}  // namespace ge2
