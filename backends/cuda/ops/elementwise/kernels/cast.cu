// cast: y = x converted between float32, float16, bfloat16, float8_e4m3fn and float8_e5m2 (round to nearest even;
// to FP8 saturating at the largest finite value, NaN kept), element by element through float32 registers (every
// one of these converts to float32 exactly, so each cast rounds once), grid-stride. Where x and y are aligned for
// it, 8 elements per step (a 16-byte load of 16-bit x; the tail element by element): mixed precision's float32 ->
// bfloat16 casts of [8192, 768] gradients in a GPT-2 step ran at about 2.4 TB/s element by element. It sits between
// float32 masters / float32 reductions and low-precision GEMMs. Scaled casts to FP8 with their amax are the
// quantize_fp8 op.
#include <cstdint>

#include "kernels/map.cuh"

namespace ge2::elementwise {

constexpr int kCastVector = 8;

template <typename In, typename Out, bool kVectorized>
__global__ void __launch_bounds__(kThreads) cast_kernel(const In* x, Out* y, int64_t numel) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t scalar_begin = 0;
  if constexpr (kVectorized) {
    const int64_t vectors = numel / kCastVector;
    for (int64_t index = thread; index < vectors; index += step) {
      const Pack<In, kCastVector> in = load_pack<In, kCastVector>(x + index * kCastVector);
      Pack<Out, kCastVector> out;
#pragma unroll
      for (int i = 0; i < kCastVector; ++i) out.values[i] = from_float<Out>(to_float(in.values[i]));
      store_pack<Out, kCastVector>(y + index * kCastVector, out);
    }
    scalar_begin = vectors * kCastVector;
  }
  for (int64_t index = scalar_begin + thread; index < numel; index += step) {
    y[index] = from_float<Out>(to_float(x[index]));
  }
}

void cast(const void* x, DType x_dtype, void* y, DType y_dtype, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  const bool vectorized =
      is_aligned(x, kCastVector * dtype_size(x_dtype)) && is_aligned(y, kCastVector * dtype_size(y_dtype));
  GE2_DISPATCH_FLOATING_AND_FLOAT8(x_dtype, "x dtype", {
    using in_t = scalar_t;
    GE2_DISPATCH_FLOATING_AND_FLOAT8(y_dtype, "dtype", {
      const auto* in = static_cast<const in_t*>(x);
      auto* out = static_cast<scalar_t*>(y);
      if (vectorized) {
        cast_kernel<in_t, scalar_t, true><<<grid_stride_blocks(numel / kCastVector + 1), kThreads, 0, stream>>>(
            in, out, numel);
      } else {
        cast_kernel<in_t, scalar_t, false><<<grid_stride_blocks(numel), kThreads, 0, stream>>>(in, out, numel);
      }
    });
  });
  GE2_CHECK_LAUNCH("elementwise cast");
}

}  // namespace ge2::elementwise
