// The kernel choice of the ops whose candidates are a 16-byte vectorized kernel and an element-by-element one that
// always works (dropout, embedding): the enum and its names, as kernel arguments and kernels() tables spell them.
#pragma once
#include <stdexcept>
#include <string>

namespace ge2 {

enum class VecKernel { Auto, Vec16, Scalar };

inline VecKernel vec_kernel_from_name(const std::string& name) {
  if (name == "auto") return VecKernel::Auto;
  if (name == "vec16") return VecKernel::Vec16;
  if (name == "scalar") return VecKernel::Scalar;
  throw std::invalid_argument("kernel: expected one of auto, vec16, scalar, got '" + name + "'");
}

inline const char* vec_kernel_name(VecKernel kernel) {
  switch (kernel) {
    case VecKernel::Auto: return "auto";
    case VecKernel::Vec16: return "vec16";
    case VecKernel::Scalar: return "scalar";
  }
  return "unknown";
}

}  // namespace ge2
