// quantize_fp8_transpose: y = FP8(x * scale) and its transpose y_t, with amax = max |x|, in one pass over a 2-d x
// (Transformer Engine's cast-transpose). FP8 training needs both layouts of x and dY (cuBLASLt's FP8 matmul takes
// only TN): writing both from one read of x saves a separate transpose's read and write.
// 32 x 32 tiles, 32 x 8 threads: each thread quantizes 4 rows of a tile column into y and a shared-memory tile,
// then writes 4 rows of the transposed tile into y_t. 32 one-byte stores per warp are one 32-byte sector.
// With a column sum (a linear layer's dbias, Transformer Engine's cast-transpose-dbias): each thread also sums its
// 4 unquantized values, the tile's 8 partial rows are added in shared memory and written as one float32 row of
// partials [row tiles, cols]; column_sum_kernel then adds each column's partials in row order (no atomics: the
// same sums every run).
#include <algorithm>

#include "api.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::quantize_fp8 {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

template <typename In, typename Out>
__global__ void __launch_bounds__(kTile * kRowsPerPass)
    quantize_transpose_kernel(const In* __restrict__ x, const float* __restrict__ scale_pointer, Out* __restrict__ y,
                              Out* __restrict__ y_t, unsigned int* __restrict__ amax,
                              float* __restrict__ column_partials, int64_t rows, int64_t cols) {
  __shared__ Out tile[kTile][kTile + 1];
  __shared__ float partial_rows[kRowsPerPass][kTile];
  const float scale = *scale_pointer;
  unsigned int amax_bits = 0;
  const int64_t tiles_across = (cols + kTile - 1) / kTile;
  const int64_t tiles = tiles_across * ((rows + kTile - 1) / kTile);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = (t / tiles_across) * kTile, col0 = (t % tiles_across) * kTile;
    float column_partial = 0.0f;
    for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
      const int64_t r = row0 + j, c = col0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float value = to_float(x[r * cols + c]);
        amax_bits = max(amax_bits, __float_as_uint(fabsf(value)));
        column_partial += value;
        const Out q = from_float<Out>(value * scale);
        y[r * cols + c] = q;
        tile[j][threadIdx.x] = q;
      }
    }
    if (column_partials != nullptr) partial_rows[threadIdx.y][threadIdx.x] = column_partial;
    __syncthreads();
    if (column_partials != nullptr && threadIdx.y == 0 && col0 + threadIdx.x < cols) {
      float sum = 0.0f;
      for (int j = 0; j < kRowsPerPass; ++j) sum += partial_rows[j][threadIdx.x];
      column_partials[(row0 / kTile) * cols + col0 + threadIdx.x] = sum;
    }
    for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
      const int64_t r = col0 + j, c = row0 + threadIdx.x;  // y_t[r, c] = y[c, r]
      if (r < cols && c < rows) y_t[r * rows + c] = tile[threadIdx.x][j];
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
  amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
  if (threadIdx.x == 0 && amax_bits != 0) atomicMax(amax, amax_bits);
}

// column_sum[c] = the sum of the row tiles' partials of column c, in row order, rounded once to x's dtype.
template <typename T>
__global__ void column_sum_kernel(const float* __restrict__ column_partials, T* __restrict__ column_sum,
                                  int64_t row_tiles, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t tile = 0; tile < row_tiles; ++tile) sum += column_partials[tile * cols + c];
  column_sum[c] = from_float<T>(sum);
}

template <typename In, typename Out>
void launch(const void* x, const float* scale, void* y, void* y_t, float* amax, float* column_partials,
            int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const int blocks = static_cast<int>(std::min<int64_t>(tiles, 132 * 16));
  quantize_transpose_kernel<In, Out><<<blocks, dim3(kTile, kRowsPerPass), 0, stream>>>(
      static_cast<const In*>(x), scale, static_cast<Out*>(y), static_cast<Out*>(y_t),
      reinterpret_cast<unsigned int*>(amax), column_partials, rows, cols);
}

}  // namespace

void launch_quantize_transpose(const void* x, DType x_dtype, const float* scale, void* y, void* y_t, DType y_dtype,
                               float* amax, void* column_sum, int64_t rows, int64_t cols, cudaStream_t stream) {
  GE2_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (cols == 0) return;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  if (column_sum != nullptr && row_tiles == 0) {  // no rows: the sums are 0
    GE2_CUDA_CHECK(cudaMemsetAsync(column_sum, 0, static_cast<std::size_t>(cols) * dtype_size(x_dtype), stream));
  }
  if (rows == 0) return;
  const std::size_t partial_bytes = static_cast<std::size_t>(row_tiles * cols) * sizeof(float);
  float* column_partials =
      column_sum != nullptr ? static_cast<float*>(StreamWorkspace::get(partial_bytes, stream)) : nullptr;
  GE2_DISPATCH_FLOATING(x_dtype, "x dtype", {
    if (y_dtype == DType::Float8E4M3) {
      launch<scalar_t, __nv_fp8_e4m3>(x, scale, y, y_t, amax, column_partials, rows, cols, stream);
    } else {
      launch<scalar_t, __nv_fp8_e5m2>(x, scale, y, y_t, amax, column_partials, rows, cols, stream);
    }
    if (column_sum != nullptr) {
      constexpr int kThreads = 256;
      column_sum_kernel<scalar_t><<<static_cast<unsigned int>((cols + kThreads - 1) / kThreads), kThreads, 0,
                                    stream>>>(column_partials, static_cast<scalar_t*>(column_sum), row_tiles, cols);
    }
  });
  GE2_CHECK_LAUNCH("quantize_fp8_transpose");
}

}  // namespace ge2::quantize_fp8
