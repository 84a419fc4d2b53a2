// cast: y = x converted between float32, float16, bfloat16, float8_e4m3fn and float8_e5m2 (round to nearest even;
// to FP8 saturating at the largest finite value, NaN kept), element by element through float32 registers (every
// one of these converts to float32 exactly, so each cast rounds once), grid-stride. Mixed precision inserts it
// between float32 masters / float32 reductions and low-precision GEMMs; it is bandwidth-bound and small next to
// the GEMMs it feeds. Scaled casts to FP8 with their amax are the quantize_fp8 op.
#include "kernels/map.cuh"

namespace ge2::elementwise {

template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads) cast_kernel(const In* x, Out* y, int64_t numel) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; index < numel; index += step) {
    y[index] = from_float<Out>(to_float(x[index]));
  }
}

void cast(const void* x, DType x_dtype, void* y, DType y_dtype, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  GE2_DISPATCH_FLOATING_AND_FLOAT8(x_dtype, "x dtype", {
    using in_t = scalar_t;
    GE2_DISPATCH_FLOATING_AND_FLOAT8(y_dtype, "dtype", {
      cast_kernel<in_t, scalar_t><<<grid_stride_blocks(numel), kThreads, 0, stream>>>(
          static_cast<const in_t*>(x), static_cast<scalar_t*>(y), numel);
    });
  });
  GE2_CHECK_LAUNCH("elementwise cast");
}

}  // namespace ge2::elementwise
