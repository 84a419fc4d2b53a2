// amax of a scaled_gemm output whose dtype cuBLASLt computes no amax for: max |y| over the elements, one pass,
// grid-stride. The maximum is taken over the float bits of |y| as unsigned integers (non-negative floats order
// like their bits), so a NaN anywhere makes the amax NaN: delayed scaling then sees the overflow instead of
// skipping it as fmaxf would.
#include "api.hpp"
#include "status.hpp"

namespace ge2::scaled_gemm {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) output_amax_kernel(const T* y, int64_t numel, unsigned int* amax_bits) {
  unsigned int local = 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; index < numel; index += step) {
    local = max(local, __float_as_uint(fabsf(to_float(y[index]))));
  }
  local = __reduce_max_sync(0xffffffffu, local);
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, local);
}

}  // namespace

void launch_output_amax(const void* y, DType dtype, int64_t numel, float* amax, cudaStream_t stream) {
  GE2_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (numel == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((numel + kThreads - 1) / kThreads, 132 * 8));
  GE2_DISPATCH_FLOATING(dtype, "y dtype", {
    output_amax_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(static_cast<const scalar_t*>(y), numel,
                                                                   reinterpret_cast<unsigned int*>(amax));
  });
  GE2_CHECK_LAUNCH("scaled_gemm output_amax");
}

}  // namespace ge2::scaled_gemm
