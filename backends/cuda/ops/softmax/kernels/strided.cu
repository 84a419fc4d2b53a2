// Kernel 4, strided: softmax over any axis of a contiguous array seen as [outer, n, inner], with no transpose. A
// block owns a tile of `width` adjacent inner columns of one outer index (threadIdx.x, so each warp reads
// contiguous runs of a row) and spreads the n entries of each column over kStridedThreads / width lanes
// (threadIdx.y). Each thread keeps online (max, sum) statistics of its entries; a shared-memory tree merges them
// per column in a fixed order; a second pass over the column writes y. With inner == 1 this is one block per row
// with scalar loads, so it runs every problem: the path that always works.
#include "softmax_common.cuh"
#include "status.hpp"

namespace ge2::softmax {
namespace {

template <typename T>
__global__ void __launch_bounds__(kStridedThreads)
    strided_forward(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner, bool log) {
  __shared__ float shared_max[kStridedThreads], shared_sum[kStridedThreads];
  const int width = blockDim.x, lanes = blockDim.y;
  const int slot = threadIdx.y * width + threadIdx.x;
  const int64_t column_tiles = (inner + width - 1) / width;
  for (int64_t tile = blockIdx.x; tile < outer * column_tiles; tile += gridDim.x) {
    const int64_t column = (tile % column_tiles) * width + threadIdx.x;
    const bool valid = column < inner;
    const int64_t base = (tile / column_tiles) * n * inner + column;
    MaxSum stats;
    if (valid) {
      int64_t j = threadIdx.y;
      for (; j + (kStridedUnroll - 1) * lanes < n; j += kStridedUnroll * lanes) {
        float values[kStridedUnroll];
#pragma unroll
        for (int u = 0; u < kStridedUnroll; ++u) values[u] = to_float(x[base + (j + u * lanes) * inner]);
#pragma unroll
        for (int u = 0; u < kStridedUnroll; ++u) stats.add<1>(values + u);
      }
      for (; j < n; j += lanes) {
        const float value = to_float(x[base + j * inner]);
        stats.add<1>(&value);
      }
    }
    shared_max[slot] = stats.max;
    shared_sum[slot] = stats.sum;
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.y) < half) {
        MaxSum merged{shared_max[slot], shared_sum[slot]};
        merged.merge(shared_max[slot + half * width], shared_sum[slot + half * width]);
        shared_max[slot] = merged.max;
        shared_sum[slot] = merged.sum;
      }
      __syncthreads();
    }
    const float max = shared_max[threadIdx.x], sum = shared_sum[threadIdx.x];
    __syncthreads();  // the next tile overwrites the shared statistics
    if (valid) {
      const float log_sum = logf(sum), inverse_sum = 1.0f / sum;
#pragma unroll 4
      for (int64_t j = threadIdx.y; j < n; j += lanes) {
        const float shifted = to_float(x[base + j * inner]) - max;
        y[base + j * inner] = from_float<T>(log ? shifted - log_sum : __expf(shifted) * inverse_sum);
      }
    }
  }
}

}  // namespace

void launch_strided_forward(const ForwardArgs& args, cudaStream_t stream) {
  const dim3 block = strided_block(args.inner);
  const unsigned grid = grid_blocks(args.outer * ((args.inner + block.x - 1) / block.x), 1);
  GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                        strided_forward<scalar_t><<<grid, block, 0, stream>>>(
                            static_cast<const scalar_t*>(args.x), static_cast<scalar_t*>(args.y), args.outer, args.n,
                            args.inner, args.log));
  GE2_CHECK_LAUNCH("softmax strided_forward");
}

}  // namespace ge2::softmax
