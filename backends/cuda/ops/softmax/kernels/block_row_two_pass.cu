// Kernel 3, block_row_two_pass: softmax over the last axis for rows of any length, one block of 512 threads per
// row. Pass 1 reads the row once with online statistics (running max, sum of exp rescaled when the max grows),
// pass 2 reads it again and writes y: two reads and one write, where the register kernels need one read. The
// second read often hits L2 for moderate rows. Four 16-byte loads in flight per thread in pass 1.
#include "float_access.hpp"
#include "softmax_common.cuh"
#include "status.hpp"

namespace ge2::softmax {
namespace {

template <typename T, int kPack>
__global__ void __launch_bounds__(kTwoPassThreads)
    block_row_two_pass_forward(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool log) {
  constexpr int64_t kStride = int64_t{kTwoPassThreads} * kPack;
  __shared__ float scratch_max[32], scratch_sum[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * n;
    MaxSum stats;
    int64_t col = static_cast<int64_t>(threadIdx.x) * kPack;
    for (; col + (kTwoPassUnroll - 1) * kStride < n; col += kTwoPassUnroll * kStride) {
      float values[kTwoPassUnroll][kPack];
#pragma unroll
      for (int u = 0; u < kTwoPassUnroll; ++u) load_floats<kPack>(x_row + col + u * kStride, values[u]);
#pragma unroll
      for (int u = 0; u < kTwoPassUnroll; ++u) stats.add<kPack>(values[u]);
    }
    for (; col < n; col += kStride) {
      float values[kPack];
      load_floats<kPack>(x_row + col, values);
      stats.add<kPack>(values);
    }
    stats = block_max_sum(stats, scratch_max, scratch_sum);
    const float log_sum = logf(stats.sum), inverse_sum = 1.0f / stats.sum;
    T* y_row = y + row * n;
#pragma unroll 4
    for (col = static_cast<int64_t>(threadIdx.x) * kPack; col < n; col += kStride) {
      float values[kPack];
      load_floats<kPack>(x_row + col, values);
#pragma unroll
      for (int i = 0; i < kPack; ++i) {
        const float shifted = values[i] - stats.max;
        values[i] = log ? shifted - log_sum : __expf(shifted) * inverse_sum;
      }
      store_floats<kPack>(y_row + col, values);
    }
  }
}

}  // namespace

void launch_block_row_two_pass_forward(const ForwardArgs& args, cudaStream_t stream) {
  const bool aligned = is_aligned(args.x, 16) && is_aligned(args.y, 16);
  dispatch_storage(args.dtype, args.n, aligned, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    block_row_two_pass_forward<T, decltype(pack)::value><<<grid_blocks(args.outer, 1), kTwoPassThreads, 0, stream>>>(
        static_cast<const T*>(args.x), static_cast<T*>(args.y), args.outer, args.n, args.log);
  });
  GE2_CHECK_LAUNCH("softmax block_row_two_pass_forward");
}

}  // namespace ge2::softmax
