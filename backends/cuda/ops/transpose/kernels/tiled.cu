// Tile kernels for a transpose that moves the input's unit-stride axis (a) away from the output's innermost axis
// (b). A block stages a tile in shared memory: it reads rows along a (coalesced in x) and writes rows along b
// (coalesced in y). Remaining axes are batch axes; one block walks tiles (a fastest, then b, then batch).
//
//   tiled         32 x 32 elements of any size, 32 x 8 threads, each moving 4 elements per phase. The tile row is
//                 padded to 33 elements so the column reads of the write phase hit 32 different banks (for 2-byte
//                 and 8-byte elements too: 33 is odd in words and in half-warps respectively).
//   tiled_packed  2-byte elements (float16, bfloat16). A 32-element tile row is only 64 bytes, so this variant
//                 moves 4-byte words: each thread reads two vertically adjacent words (2 rows x 2 columns),
//                 transposes that 2x2 block in registers with __byte_perm, and stores one word per column, which
//                 already holds that column's 2 consecutive output elements. Tiles are 64 x 64 elements (8 KB in
//                 flight per block) and every warp reads and writes 128 contiguous bytes.
#include <algorithm>

#include "api.hpp"
#include "status.hpp"

namespace ge2::transpose {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Origin of tile `tile` (a0, b0 in elements) and the offsets of its batch coordinates in x and y.
__device__ __forceinline__ void tile_origin(const TileParams& p, uint32_t tile, int tile_size, int64_t& a0,
                                            int64_t& b0, int64_t& src_base, int64_t& dst_base) {
  uint32_t tile_a, tile_b;
  const uint32_t rest = p.tiles_a.divmod(tile, tile_a);
  uint32_t batch = p.tiles_b.divmod(rest, tile_b);
  a0 = static_cast<int64_t>(tile_a) * tile_size;
  b0 = static_cast<int64_t>(tile_b) * tile_size;
  src_base = 0;
  dst_base = 0;
#pragma unroll
  for (int k = kMaxDims - 1; k >= 1; --k) {
    if (k < p.batch_rank) {
      uint32_t coordinate;
      batch = p.batch_shape[k].divmod(batch, coordinate);
      src_base += static_cast<int64_t>(coordinate) * p.src_batch_strides[k];
      dst_base += static_cast<int64_t>(coordinate) * p.dst_batch_strides[k];
    }
  }
  if (p.batch_rank > 0) {
    src_base += static_cast<int64_t>(batch) * p.src_batch_strides[0];
    dst_base += static_cast<int64_t>(batch) * p.dst_batch_strides[0];
  }
}

template <typename Unit>
__global__ void __launch_bounds__(kThreads) tiled_kernel(const Unit* __restrict__ x, Unit* __restrict__ y,
                                                         TileParams p) {
  __shared__ Unit tile[kTile][kTile + 1];
  const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
  const uint32_t total = static_cast<uint32_t>(p.total_tiles);
  for (uint32_t t = blockIdx.x; t < total; t += gridDim.x) {
    int64_t a0, b0, src_base, dst_base;
    tile_origin(p, t, kTile, a0, b0, src_base, dst_base);
    // Read: a warp takes 32 consecutive elements of one x row (fixed b). Every load is issued before the first
    // shared store, so a thread has 4 loads in flight; positions off the array hold zeros that are never written.
    Unit values[kTile / kWarps];
#pragma unroll
    for (int step = 0; step < kTile / kWarps; ++step) {
      const int64_t a = a0 + lane, b = b0 + row + step * kWarps;
      values[step] = a < p.extent_a && b < p.extent_b ? x[src_base + b * p.src_stride_b + a] : Unit{};
    }
#pragma unroll
    for (int step = 0; step < kTile / kWarps; ++step) tile[row + step * kWarps][lane] = values[step];
    __syncthreads();
    // Write: a warp takes 32 consecutive elements of one y row (fixed a).
#pragma unroll
    for (int step = 0; step < kTile / kWarps; ++step) {
      const int64_t a = a0 + row + step * kWarps, b = b0 + lane;
      if (a < p.extent_a && b < p.extent_b) y[dst_base + a * p.dst_stride_a + b] = tile[lane][row + step * kWarps];
    }
    __syncthreads();  // the next tile overwrites the shared tile
  }
}

// Offsets are in 2-byte elements and even (checked by the launcher), so word index = offset / 2.
__global__ void __launch_bounds__(kThreads) tiled_packed_kernel(const uint32_t* __restrict__ x,
                                                                uint32_t* __restrict__ y, TileParams p) {
  // words[r][w]: tile column c lives in row r = (c % 2) * 32 + c / 2, so that the 32 lanes of a warp storing
  // columns 2*lane (or 2*lane + 1) hit 32 different banks; word w holds rows 2w and 2w + 1 of that column.
  __shared__ uint32_t words[kPackedTile][kPackedTile / 2 + 1];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t total = static_cast<uint32_t>(p.total_tiles);
  for (uint32_t t = blockIdx.x; t < total; t += gridDim.x) {
    int64_t a0, b0, src_base, dst_base;
    tile_origin(p, t, kPackedTile, a0, b0, src_base, dst_base);
    // Read: a warp takes 64 elements (128 bytes) of two adjacent x rows. Both extents are even, so a < extent_a
    // covers column a + 1 and b < extent_b covers row b + 1. All 8 loads are issued before the first shared store.
    uint32_t row0[kPackedTile / 2 / kWarps], row1[kPackedTile / 2 / kWarps];
#pragma unroll
    for (int step = 0; step < kPackedTile / 2 / kWarps; ++step) {
      const int64_t a = a0 + 2 * lane, b = b0 + 2 * (warp + step * kWarps);
      const bool inside = a < p.extent_a && b < p.extent_b;
      const int64_t offset = src_base + b * p.src_stride_b + a;
      row0[step] = inside ? x[offset / 2] : 0u;
      row1[step] = inside ? x[(offset + p.src_stride_b) / 2] : 0u;
    }
#pragma unroll
    for (int step = 0; step < kPackedTile / 2 / kWarps; ++step) {
      const int pair = warp + step * kWarps;  // tile rows 2 * pair and 2 * pair + 1
      words[lane][pair] = __byte_perm(row0[step], row1[step], 0x5410);       // column a: (row b, row b + 1)
      words[32 + lane][pair] = __byte_perm(row0[step], row1[step], 0x7632);  // column a + 1
    }
    __syncthreads();
    // Write: a warp takes 64 elements (128 bytes) of one y row (fixed a).
#pragma unroll
    for (int step = 0; step < kPackedTile / kWarps; ++step) {
      const int column = warp + step * kWarps;
      const int64_t a = a0 + column, b = b0 + 2 * lane;
      if (a < p.extent_a && b < p.extent_b) {
        y[(dst_base + a * p.dst_stride_a + b) / 2] = words[(column % 2) * 32 + column / 2][lane];
      }
    }
    __syncthreads();
  }
}

// One block per tile up to 2^20 blocks; beyond that blocks loop over tiles.
unsigned blocks_for(const TileParams& params) {
  return static_cast<unsigned>(std::min<int64_t>(params.total_tiles, int64_t{1} << 20));
}

template <typename Unit>
void launch_tiled_typed(const void* x, void* y, const TileParams& params, cudaStream_t stream) {
  tiled_kernel<Unit><<<blocks_for(params), kThreads, 0, stream>>>(static_cast<const Unit*>(x), static_cast<Unit*>(y),
                                                                  params);
}

}  // namespace

void launch_tiled(const void* x, void* y, const TileParams& params, int element_bytes, cudaStream_t stream) {
  switch (element_bytes) {
    case 1: launch_tiled_typed<uint8_t>(x, y, params, stream); break;
    case 2: launch_tiled_typed<uint16_t>(x, y, params, stream); break;
    case 4: launch_tiled_typed<uint32_t>(x, y, params, stream); break;
    case 8: launch_tiled_typed<uint2>(x, y, params, stream); break;
    default: throw std::logic_error("transpose tiled: element size must be 1, 2, 4 or 8 bytes");
  }
  GE2_CHECK_LAUNCH("transpose tiled_kernel");
}

void launch_tiled_packed(const void* x, void* y, const TileParams& params, cudaStream_t stream) {
  tiled_packed_kernel<<<blocks_for(params), kThreads, 0, stream>>>(
      static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), params);
  GE2_CHECK_LAUNCH("transpose tiled_packed_kernel");
}

}  // namespace ge2::transpose
