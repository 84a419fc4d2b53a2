// Kernel 1, warp_row: softmax over the last axis for rows of at most 1024 elements. A group of kWidth lanes owns a
// row (a whole warp, or a fraction of one for short rows, so no lane idles) and holds it in registers: x is read
// once, y written once. 16-byte accesses when both pointers are 16-byte aligned and the row length is a multiple of
// the vector width; otherwise scalar (still coalesced) accesses.
#include "float_access.hpp"
#include "group_reduction.hpp"
#include "reduction.hpp"
#include "softmax_common.cuh"
#include "status.hpp"

namespace ge2::softmax {
namespace {

constexpr int kThreads = 128;

template <typename T, int kPack, int kPacksPerLane, int kWidth>
__global__ void __launch_bounds__(kThreads)
    warp_row_forward(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool log) {
  constexpr int kRowsPerBlock = kThreads / kWidth;
  constexpr int kValues = kPack * kPacksPerLane;
  const int lane = threadIdx.x % kWidth;
  // The loop bound is the same for the whole block, so every lane reaches the shuffles; rows past the end are
  // carried along masked.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t row = first + threadIdx.x / kWidth;
    const bool active = row < rows;
    float values[kValues];
#pragma unroll
    for (int p = 0; p < kPacksPerLane; ++p) {
      const int64_t col = static_cast<int64_t>(p * kWidth + lane) * kPack;
      if (active && col < n) {
        load_floats<kPack>(x + row * n + col, values + p * kPack);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) values[p * kPack + i] = -INFINITY;  // exp(-inf - max) = 0
      }
    }
    float max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kValues; ++i) max = fmaxf(max, values[i]);
    max = group_reduce<kWidth>(max, MaxOp());
    // values become what the write needs (exp(x - max) for softmax, x - max for log_softmax): one live array.
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      const float shifted = values[i] - max, exponential = __expf(shifted);
      sum += exponential;
      values[i] = log ? shifted : exponential;
    }
    sum = group_reduce<kWidth>(sum, SumOp());
    // (x - max) - log(sum): x - (max + log(sum)) would round away a small result next to a large max.
    const float log_sum = logf(sum), inverse_sum = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < kValues; ++i) values[i] = log ? values[i] - log_sum : values[i] * inverse_sum;
#pragma unroll
    for (int p = 0; p < kPacksPerLane; ++p) {
      const int64_t col = static_cast<int64_t>(p * kWidth + lane) * kPack;
      if (active && col < n) store_floats<kPack>(y + row * n + col, values + p * kPack);
    }
  }
}

}  // namespace

void launch_warp_row_forward(const ForwardArgs& args, cudaStream_t stream) {
  const bool aligned = is_aligned(args.x, 16) && is_aligned(args.y, 16);
  dispatch_storage(args.dtype, args.n, aligned, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    auto launch = [&](auto packs_per_lane, auto width) {
      constexpr int kPacksPerLane = decltype(packs_per_lane)::value, kWidth = decltype(width)::value;
      warp_row_forward<T, kPack, kPacksPerLane, kWidth>
          <<<grid_blocks(args.outer, kThreads / kWidth), kThreads, 0, stream>>>(
              static_cast<const T*>(args.x), static_cast<T*>(args.y), args.outer, args.n, args.log);
    };
    dispatch_warp_row_shape<kPack>((args.n + kPack - 1) / kPack, launch);
  });
  GE2_CHECK_LAUNCH("softmax warp_row_forward");
}

}  // namespace ge2::softmax
