// quantize_fp8 kernels: y = FP8(x * scale) (round to nearest even, saturating, NaN kept) and amax = max |x| in one
// pass. Bandwidth-bound: x is read once, y written once; the amax costs a block reduction and one atomicMax per
// block into a stream counter, and the last block writes it to amax (grid_completion.cuh: no memset before the kernel).
// The maximum is over the float bits of |x| as unsigned integers (non-negative floats order like their bits), so a
// NaN in x makes the amax NaN and delayed scaling sees the overflow (fmaxf would drop it).
//   1. scalar: one element per thread, grid-stride
//   2. vec8:   8 elements per thread and step (16 bytes of 16-bit x, 8 bytes of y), the tail element-wise
#include <algorithm>

#include "api.hpp"
#include "grid_completion.cuh"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::quantize_fp8 {
namespace {

constexpr int kThreads = 256;
constexpr int kVector = 8;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T value[N];
};

template <typename In, typename Out>
__device__ __forceinline__ Out quantize_one(In x, float scale, unsigned int& amax_bits) {
  const float value = to_float(x);
  amax_bits = max(amax_bits, __float_as_uint(fabsf(value)));
  return from_float<Out>(value * scale);
}

template <typename In, typename Out, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const In* __restrict__ x, const float* __restrict__ scale_pointer, Out* __restrict__ y,
                    float* __restrict__ amax, unsigned int* __restrict__ counters, int64_t numel) {
  __shared__ unsigned int warp_amax[kThreads / 32];
  const float scale = *scale_pointer;
  unsigned int amax_bits = 0;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t scalar_begin = 0;
  if constexpr (kVectorized) {
    const int64_t vectors = numel / kVector;
    const auto* x_packs = reinterpret_cast<const Pack<In, kVector>*>(x);
    auto* y_packs = reinterpret_cast<Pack<Out, kVector>*>(y);
    for (int64_t index = thread; index < vectors; index += threads) {
      const Pack<In, kVector> in = x_packs[index];
      Pack<Out, kVector> out;
#pragma unroll
      for (int i = 0; i < kVector; ++i) out.value[i] = quantize_one<In, Out>(in.value[i], scale, amax_bits);
      y_packs[index] = out;
    }
    scalar_begin = vectors * kVector;
  }
  for (int64_t index = scalar_begin + thread; index < numel; index += threads) {
    y[index] = quantize_one<In, Out>(x[index], scale, amax_bits);
  }
  amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) amax_bits = max(amax_bits, warp_amax[w]);
    finish_amax(amax_bits, counters, amax);
  }
}

int blocks_for(int64_t work) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(1, (work + kThreads - 1) / kThreads), 132 * 8));
}

template <typename In, typename Out>
void launch(const void* x, const float* scale, void* y, float* amax, unsigned int* counters, int64_t numel,
            bool vectorized, cudaStream_t stream) {
  const auto* in = static_cast<const In*>(x);
  auto* out = static_cast<Out*>(y);
  if (vectorized) {
    quantize_kernel<In, Out, true><<<blocks_for(numel / kVector + 1), kThreads, 0, stream>>>(in, scale, out, amax,
                                                                                            counters, numel);
  } else {
    quantize_kernel<In, Out, false><<<blocks_for(numel), kThreads, 0, stream>>>(in, scale, out, amax, counters,
                                                                               numel);
  }
}

}  // namespace

void launch_quantize(const void* x, DType x_dtype, const float* scale, void* y, DType y_dtype, float* amax,
                     int64_t numel, bool vectorized, cudaStream_t stream) {
  if (numel == 0) {  // no kernel: the amax of nothing is 0
    GE2_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    return;
  }
  auto* counters = static_cast<unsigned int*>(StreamWorkspace::get_zeroed(counter_bytes(0), stream));
  GE2_DISPATCH_FLOATING(x_dtype, "x dtype", {
    if (y_dtype == DType::Float8E4M3) {
      launch<scalar_t, __nv_fp8_e4m3>(x, scale, y, amax, counters, numel, vectorized, stream);
    } else {
      launch<scalar_t, __nv_fp8_e5m2>(x, scale, y, amax, counters, numel, vectorized, stream);
    }
  });
  GE2_CHECK_LAUNCH("quantize_fp8");
}

}  // namespace ge2::quantize_fp8
