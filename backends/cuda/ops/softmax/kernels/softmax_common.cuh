// Pieces every softmax kernel file shares: the running (max, sum of exp) statistics of the two-pass and strided
// kernels, and the host-side choice of lane-group shape for warp_row.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "api.hpp"
#include "storage_dispatch.hpp"

namespace ge2::softmax {

// Grid-stride kernels launch at most this many blocks; more work loops.
constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;

inline unsigned grid_blocks(int64_t work_items, int64_t items_per_block) {
  return static_cast<unsigned>(std::min<int64_t>((work_items + items_per_block - 1) / items_per_block,
                                                 kMaxGridBlocks));
}

// ---- block_row geometry -------------------------------------------------------------------------------------------
// A thread holds kBlockRowForwardValues values of x (forward) or kBlockRowBackwardValues each of y and dy
// (backward); a block has at most kBlockRowMaxThreads threads, which sets the row limits in api.hpp.
constexpr int kBlockRowMaxThreads = 512;
constexpr int kBlockRowForwardValues = 32;
constexpr int kBlockRowBackwardValues = 16;
static_assert(int64_t{kBlockRowMaxThreads} * kBlockRowForwardValues == kBlockRowMaxForward, "forward row limit");
static_assert(int64_t{kBlockRowMaxThreads} * kBlockRowBackwardValues == kBlockRowMaxBackward, "backward row limit");

// The narrowest block (a multiple of 32 threads) that holds a row of n elements, `values` per thread.
inline int block_row_threads(int64_t n, int pack, int values) {
  const int64_t packs_per_thread = values / pack;
  const int64_t threads = (n + int64_t{pack} * packs_per_thread - 1) / (int64_t{pack} * packs_per_thread);
  return static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32));
}

// ---- block_row_two_pass and strided geometry ----------------------------------------------------------------------
constexpr int kTwoPassThreads = 512;
constexpr int kTwoPassUnroll = 4;  // packs in flight per thread in the reading passes
constexpr int kStridedThreads = 256;
constexpr int kStridedUnroll = 4;

// The strided kernels' block: `width` adjacent columns of the inner dimension (a power of two <= 32, so a warp reads
// contiguous runs) times kStridedThreads / width lanes along the softmax axis.
inline dim3 strided_block(int64_t inner) {
  int width = 1;
  while (width < 32 && width < inner) width *= 2;
  return dim3(static_cast<unsigned>(width), static_cast<unsigned>(kStridedThreads / width));
}

// Running softmax statistics of a stream of values: their maximum and sum(exp(v - max)). Empty: (-inf, 0).
// -inf values add nothing (a row may start with masked entries); a NaN makes the sum NaN, so the whole row comes out
// NaN, as in the float64 reference. __expf is exact enough here: its error grows with |argument|, and arguments are
// <= 0, where large magnitudes give values far below float32 tolerances.
struct MaxSum {
  float max = -INFINITY;
  float sum = 0.0f;

  template <int kN>
  __device__ __forceinline__ void add(const float* values) {
    float pack_max = values[0];
#pragma unroll
    for (int i = 1; i < kN; ++i) pack_max = fmaxf(pack_max, values[i]);
    const float new_max = fmaxf(max, pack_max);
    if (new_max == -INFINITY) {  // nothing but -inf (or NaN) so far: exp(v - max) would be exp(NaN)
#pragma unroll
      for (int i = 0; i < kN; ++i) sum += values[i] == -INFINITY ? 0.0f : values[i];
      return;
    }
    if (new_max > max) {  // rescale the sum to the new maximum (from -inf: the sum is 0, or NaN and stays NaN)
      sum *= __expf(max - new_max);
      max = new_max;
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) sum += __expf(values[i] - max);
  }

  __device__ __forceinline__ void merge(float other_max, float other_sum) {
    const float new_max = fmaxf(max, other_max);
    if (new_max == -INFINITY) {
      sum += other_sum;
      return;
    }
    sum = sum * __expf(max - new_max) + other_sum * __expf(other_max - new_max);
    max = new_max;
  }
};

__device__ __forceinline__ MaxSum warp_max_sum(MaxSum stats) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    stats.merge(__shfl_xor_sync(0xffffffffu, stats.max, offset), __shfl_xor_sync(0xffffffffu, stats.sum, offset));
  }
  return stats;
}

// Every thread gets the statistics of the whole block. The block size is a multiple of 32; scratch holds 32 floats
// each. The trailing barrier makes repeated calls with the same scratch safe.
__device__ __forceinline__ MaxSum block_max_sum(MaxSum stats, float* scratch_max, float* scratch_sum) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  stats = warp_max_sum(stats);
  if (lane == 0) {
    scratch_max[warp] = stats.max;
    scratch_sum[warp] = stats.sum;
  }
  __syncthreads();
  MaxSum total;
  if (lane < warps) {
    total.max = scratch_max[lane];
    total.sum = scratch_sum[lane];
  }
  total = warp_max_sum(total);
  __syncthreads();
  return total;
}

// ---- warp_row lane-group shapes ----------------------------------------------------------------------------------
// A row of `packs` packs (kPack elements each) goes to a group of kWidth lanes holding kPacksPerLane packs each:
// short rows take a fraction of a warp (one pack per lane, several rows per warp), longer rows a whole warp with
// a power-of-two number of packs per lane. dispatch_warp_row_shape calls
//   launch(std::integral_constant<int, kPacksPerLane>, std::integral_constant<int, kWidth>)
// with the smallest shape that holds the row.
template <int kPack, int kPacksPerLane, typename Launch>
void dispatch_full_warp(int64_t packs, Launch& launch) {
  if constexpr (int64_t{kPacksPerLane} * kPack * 32 > kWarpRowMax) {
    throw std::logic_error("softmax warp_row: row longer than kWarpRowMax reached the dispatch");
  } else {
    if (packs <= int64_t{kPacksPerLane} * 32) {
      launch(Constant<kPacksPerLane>{}, Constant<32>{});
    } else {
      dispatch_full_warp<kPack, kPacksPerLane * 2>(packs, launch);
    }
  }
}

template <int kPack, int kWidth = 1, typename Launch>
void dispatch_warp_row_shape(int64_t packs, Launch& launch) {
  if constexpr (kWidth == 32) {
    dispatch_full_warp<kPack, 1>(packs, launch);
  } else {
    if (packs <= kWidth) {
      launch(Constant<1>{}, Constant<kWidth>{});
    } else {
      dispatch_warp_row_shape<kPack, kWidth * 2>(packs, launch);
    }
  }
}

}  // namespace ge2::softmax
