// dropout: y = x * mask / (1 - p), the mask drawn from Philox4x32-10 keyed by (seed, offset + element index) (see
// philox.cuh), so the same (seed, offset) gives the same mask on any launch shape. Backward is the same op on dy:
// dx = dy * mask / (1 - p), the mask regenerated rather than stored. p == 0 is a plain copy.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"
#include "vec_kernel.hpp"

namespace ge2::dropout {

using Kernel = VecKernel;  // vec16, then scalar (_common/vec_kernel.hpp)
inline Kernel kernel_from_name(const std::string& name) { return vec_kernel_from_name(name); }
inline const char* kernel_name(Kernel kernel) { return vec_kernel_name(kernel); }

struct Args {
  const void* x = nullptr;  // (count,), dtype; may be y itself (in place)
  void* y = nullptr;
  int64_t count = 0;
  DType dtype = DType::Float32;
  double p = 0.0;  // drop probability, [0, 1)
  uint64_t seed = 0, offset = 0;
};

// Runs `kernel` (std::invalid_argument when it cannot run the problem) and returns it.
Kernel run(const Args& args, Kernel kernel, cudaStream_t stream);

// Empty when `kernel` can run the problem; otherwise the reason it cannot. `aligned`: x and y 16-byte aligned.
std::string unsupported_reason(Kernel kernel, uint64_t offset, bool aligned);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu and kernels/*.cu ---------------------------------------------------------
void launch_vec16(const Args& args, uint64_t threshold, float scale, cudaStream_t stream);
void launch_scalar(const Args& args, uint64_t threshold, float scale, cudaStream_t stream);

}  // namespace ge2::dropout
