// Kernel 2, block_row: softmax over the last axis for rows of up to 16384 elements, one block per row and the row
// held in registers (x read once, y written once): each thread keeps kPacksPerThread packs (32 float32 values),
// and the block is as wide as the row needs (a multiple of 32 threads, at most 512). For float16 rows of 4096 that
// is 128 threads with four 16-byte loads each, all issued before the first reduction.
#include "float_access.hpp"
#include "reduction.hpp"
#include "softmax_common.cuh"
#include "status.hpp"

namespace ge2::softmax {
namespace {

template <typename T, int kPack>
__global__ void __launch_bounds__(kBlockRowMaxThreads)
    block_row_forward(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool log) {
  constexpr int kPacksPerThread = kBlockRowForwardValues / kPack;
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * n;
    float values[kBlockRowForwardValues];  // 32-bit column indices below: n <= kBlockRowMaxForward
#pragma unroll
    for (int p = 0; p < kPacksPerThread; ++p) {
      const int col = (p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kPack;
      if (col < n) {
        load_floats<kPack>(x_row + col, values + p * kPack);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) values[p * kPack + i] = -INFINITY;
      }
    }
    float max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kBlockRowForwardValues; ++i) max = fmaxf(max, values[i]);
    max = block_reduce(max, MaxOp(), scratch);
    // values become what the write needs (exp(x - max) for softmax, x - max for log_softmax): one live array.
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlockRowForwardValues; ++i) {
      const float shifted = values[i] - max, exponential = __expf(shifted);
      sum += exponential;
      values[i] = log ? shifted : exponential;
    }
    sum = block_reduce(sum, SumOp(), scratch);
    const float log_sum = logf(sum), inverse_sum = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < kBlockRowForwardValues; ++i) values[i] = log ? values[i] - log_sum : values[i] * inverse_sum;
    T* y_row = y + row * n;
#pragma unroll
    for (int p = 0; p < kPacksPerThread; ++p) {
      const int col = (p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kPack;
      if (col < n) store_floats<kPack>(y_row + col, values + p * kPack);
    }
  }
}

}  // namespace

void launch_block_row_forward(const ForwardArgs& args, cudaStream_t stream) {
  const bool aligned = is_aligned(args.x, 16) && is_aligned(args.y, 16);
  dispatch_storage(args.dtype, args.n, aligned, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    const int threads = block_row_threads(args.n, kPack, kBlockRowForwardValues);
    block_row_forward<T, kPack><<<grid_blocks(args.outer, 1), threads, 0, stream>>>(
        static_cast<const T*>(args.x), static_cast<T*>(args.y), args.outer, args.n, args.log);
  });
  GE2_CHECK_LAUNCH("softmax block_row_forward");
}

}  // namespace ge2::softmax
