// quantize_fp8_transpose: y = FP8(x * scale) and its transpose y_t, with amax = max |x|, in one pass over a 2-d x
// (Transformer Engine's cast-transpose). FP8 training needs both layouts of x and dY (cuBLASLt's FP8 matmul takes
// only TN): writing both from one read of x saves a separate transpose's read and write.
// 32 x 32 tiles, 32 x 8 threads: each thread quantizes 4 rows of a tile column into y and a shared-memory tile,
// then writes 4 rows of the transposed tile into y_t. 32 one-byte stores per warp are one 32-byte sector.
#include <algorithm>

#include "api.hpp"
#include "status.hpp"

namespace ge2::quantize_fp8 {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

template <typename In, typename Out>
__global__ void __launch_bounds__(kTile * kRowsPerPass)
    quantize_transpose_kernel(const In* __restrict__ x, const float* __restrict__ scale_pointer, Out* __restrict__ y,
                              Out* __restrict__ y_t, unsigned int* __restrict__ amax, int64_t rows, int64_t cols) {
  __shared__ Out tile[kTile][kTile + 1];
  const float scale = *scale_pointer;
  unsigned int amax_bits = 0;
  const int64_t tiles_across = (cols + kTile - 1) / kTile;
  const int64_t tiles = tiles_across * ((rows + kTile - 1) / kTile);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = (t / tiles_across) * kTile, col0 = (t % tiles_across) * kTile;
    for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
      const int64_t r = row0 + j, c = col0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float value = to_float(x[r * cols + c]);
        amax_bits = max(amax_bits, __float_as_uint(fabsf(value)));
        const Out q = from_float<Out>(value * scale);
        y[r * cols + c] = q;
        tile[j][threadIdx.x] = q;
      }
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
      const int64_t r = col0 + j, c = row0 + threadIdx.x;  // y_t[r, c] = y[c, r]
      if (r < cols && c < rows) y_t[r * rows + c] = tile[threadIdx.x][j];
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
  amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
  if (threadIdx.x == 0 && amax_bits != 0) atomicMax(amax, amax_bits);
}

template <typename In, typename Out>
void launch(const void* x, const float* scale, void* y, void* y_t, float* amax, int64_t rows, int64_t cols,
            cudaStream_t stream) {
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const int blocks = static_cast<int>(std::min<int64_t>(tiles, 132 * 16));
  quantize_transpose_kernel<In, Out><<<blocks, dim3(kTile, kRowsPerPass), 0, stream>>>(
      static_cast<const In*>(x), scale, static_cast<Out*>(y), static_cast<Out*>(y_t),
      reinterpret_cast<unsigned int*>(amax), rows, cols);
}

}  // namespace

void launch_quantize_transpose(const void* x, DType x_dtype, const float* scale, void* y, void* y_t, DType y_dtype,
                               float* amax, int64_t rows, int64_t cols, cudaStream_t stream) {
  GE2_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (rows == 0 || cols == 0) return;
  GE2_DISPATCH_FLOATING(x_dtype, "x dtype", {
    if (y_dtype == DType::Float8E4M3) {
      launch<scalar_t, __nv_fp8_e4m3>(x, scale, y, y_t, amax, rows, cols, stream);
    } else {
      launch<scalar_t, __nv_fp8_e5m2>(x, scale, y, y_t, amax, rows, cols, stream);
    }
  });
  GE2_CHECK_LAUNCH("quantize_fp8_transpose");
}

}  // namespace ge2::quantize_fp8
