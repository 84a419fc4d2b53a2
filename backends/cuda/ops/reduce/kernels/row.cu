// Kernels 1 and 2: reduction of contiguous runs (Rows: y[row] = combine(x[row, :]), the reduced axes trailing).
//   row_warp:  a group of kWidth lanes per row (a whole warp for runs of 32 vectors or more, a fraction of one for
//              short runs, so no lane idles), four 16-byte loads in flight per lane, one accumulator per vector slot.
//   row_block: a block of 512 threads per row for long runs. When there are fewer rows than SMs (down to the
//              all-reduce, one row), each run is cut into chunks reduced by separate blocks into float32 partials
//              that finalize_partials combines in a fixed order: two passes, deterministic.
#include "float_access.hpp"
#include "group_reduction.hpp"
#include "reduce_common.cuh"
#include "status.hpp"

namespace ge2::reduce {
namespace {

constexpr int kRowWarpThreads = 128;
constexpr int kRowBlockThreads = 512;
constexpr int kUnroll = 4;

// Folds the packs at pack indices first, first + step, ... < last of `row` into acc (kUnroll loads in flight).
template <typename T, typename Op, int kPack>
__device__ __forceinline__ void accumulate_run(const T* __restrict__ row, int64_t first, int64_t last, int64_t step,
                                               Op op, float* acc) {
  int64_t p = first;
  for (; p + (kUnroll - 1) * step < last; p += kUnroll * step) {
    float values[kUnroll][kPack];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_floats<kPack>(row + (p + u * step) * kPack, values[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kPack; ++i) acc[i] = op(acc[i], values[u][i]);
    }
  }
  for (; p < last; p += step) {
    float values[kPack];
    load_floats<kPack>(row + p * kPack, values);
#pragma unroll
    for (int i = 0; i < kPack; ++i) acc[i] = op(acc[i], values[i]);
  }
}

template <typename Op, int kPack>
__device__ __forceinline__ float combine_slots(const float* acc, Op op) {
  float total = acc[0];
#pragma unroll
  for (int i = 1; i < kPack; ++i) total = op(total, acc[i]);
  return total;
}

template <typename T, typename Op, int kPack, int kWidth>
__global__ void __launch_bounds__(kRowWarpThreads)
    row_warp_reduce(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t length, float scale) {
  constexpr int kRowsPerBlock = kRowWarpThreads / kWidth;
  const Op op;
  const int lane = threadIdx.x % kWidth;
  const int64_t packs = length / kPack;
  // Uniform loop bound over the block, so every lane reaches the shuffles; rows past the end are masked.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t row = first + threadIdx.x / kWidth;
    float acc[kPack];
#pragma unroll
    for (int i = 0; i < kPack; ++i) acc[i] = Op::identity();
    if (row < rows) accumulate_run<T, Op, kPack>(x + row * length, lane, packs, kWidth, op, acc);
    const float total = group_reduce<kWidth>(combine_slots<Op, kPack>(acc, op), op);
    if (row < rows && lane == 0) y[row] = from_float<T>(total * scale);
  }
}

template <typename T, typename Op, int kPack>
__global__ void __launch_bounds__(kRowBlockThreads)
    row_block_reduce(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ partials, int64_t rows,
                     int64_t length, int64_t chunk, int64_t splits, float scale) {
  __shared__ float scratch[32];
  const Op op;
  for (int64_t task = blockIdx.x; task < rows * splits; task += gridDim.x) {
    const int64_t row = task / splits, split = task % splits;
    const int64_t begin = split * chunk, end = min(length, begin + chunk);  // multiples of kPack
    float acc[kPack];
#pragma unroll
    for (int i = 0; i < kPack; ++i) acc[i] = Op::identity();
    accumulate_run<T, Op, kPack>(x + row * length, (begin / kPack) + threadIdx.x, end / kPack, kRowBlockThreads, op,
                                 acc);
    const float total = block_reduce(combine_slots<Op, kPack>(acc, op), op, scratch);
    if (threadIdx.x == 0) {
      if (partials != nullptr) {
        partials[split * rows + row] = total;
      } else {
        y[row] = from_float<T>(total * scale);
      }
    }
  }
}

// One accumulator per pack slot: the smallest group of lanes that gives every lane at least one pack.
int row_warp_width(int64_t packs) { return std::min(32, next_power_of_two(packs)); }

}  // namespace

void launch_row_warp(const ForwardArgs& args, cudaStream_t stream) {
  const Layout& layout = args.layout;
  const float scale = output_scale(args.reduction, layout.count);
  dispatch_storage(args.dtype, layout.length, is_aligned(args.x, 16), [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    dispatch_reduction(args.reduction, [&](auto op) {
      using Op = decltype(op);
      auto launch = [&](auto width) {
        constexpr int kWidth = decltype(width)::value;
        row_warp_reduce<T, Op, kPack, kWidth><<<grid_blocks(layout.outer, kRowWarpThreads / kWidth),
                                                 kRowWarpThreads, 0, stream>>>(
            static_cast<const T*>(args.x), static_cast<T*>(args.y), layout.outer, layout.length, scale);
      };
      switch (row_warp_width(layout.length / kPack)) {
        case 1: launch(Constant<1>{}); break;
        case 2: launch(Constant<2>{}); break;
        case 4: launch(Constant<4>{}); break;
        case 8: launch(Constant<8>{}); break;
        case 16: launch(Constant<16>{}); break;
        default: launch(Constant<32>{}); break;
      }
    });
  });
  GE2_CHECK_LAUNCH("reduce row_warp");
}

void launch_row_block(const ForwardArgs& args, cudaStream_t stream) {
  const Layout& layout = args.layout;
  const float scale = output_scale(args.reduction, layout.count);
  dispatch_storage(args.dtype, layout.length, is_aligned(args.x, 16), [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    // A chunk gives each thread at least 8 packs.
    const Split split = plan_split(layout.outer, layout.outer, layout.length, int64_t{kRowBlockThreads} * kPack * 8,
                                   kPack, stream);
    dispatch_reduction(args.reduction, [&](auto op) {
      using Op = decltype(op);
      row_block_reduce<T, Op, kPack><<<grid_blocks(layout.outer * split.splits, 1), kRowBlockThreads, 0, stream>>>(
          static_cast<const T*>(args.x), static_cast<T*>(args.y), split.partials, layout.outer, layout.length,
          split.chunk, split.splits, scale);
    });
    GE2_CHECK_LAUNCH("reduce row_block");
    if (split.splits > 1) {
      launch_finalize_partials(split.partials, args.y, layout.outer, split.splits, args.dtype, args.reduction, scale,
                               stream);
    }
  });
}

}  // namespace ge2::reduce
