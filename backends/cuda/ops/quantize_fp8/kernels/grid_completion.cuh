// Grid completion for the quantize kernels: the block that finishes last writes the amax (and, per column strip, the
// column sums) instead of every block accumulating into outputs that a memset node zeroed before the kernel. A
// captured FP8 training step then holds no memset per quantize, and the column sums no second kernel.
// The counters live in StreamWorkspace::get_zeroed: the block that completes a count resets it, so they are zero
// again when the next kernel on the stream starts (the results do not depend on which block finishes last: the
// amax is an exact maximum, and a column's partials are added in row order whoever adds them).
#pragma once
#include <cstddef>
#include <cstdint>

#include "dtype.hpp"

namespace ge2::quantize_fp8 {

// The counters: [0] the grid's amax so far (float bits), [1] blocks finished, [2 + s] row tiles finished in column
// strip s (quantize_fp8_transpose's column sums).
constexpr int kAmaxBitsCounter = 0;
constexpr int kBlocksDoneCounter = 1;
constexpr int kFirstStripCounter = 2;

inline std::size_t counter_bytes(int64_t column_strips) {
  return static_cast<std::size_t>(kFirstStripCounter + column_strips) * sizeof(unsigned int);
}

// One thread of each block, once, last: the block's amax as float bits (0 for none). The last block to finish
// writes the grid's maximum into amax and resets both counters.
__device__ __forceinline__ void finish_amax(unsigned int block_amax_bits, unsigned int* counters, float* amax) {
  if (block_amax_bits != 0) atomicMax(counters + kAmaxBitsCounter, block_amax_bits);
  __threadfence();  // this block's maximum is in before the block counts as finished
  if (atomicAdd(counters + kBlocksDoneCounter, 1u) == gridDim.x - 1) {
    __threadfence();
    *amax = __uint_as_float(atomicExch(counters + kAmaxBitsCounter, 0u));
    counters[kBlocksDoneCounter] = 0;
  }
}

// Every thread of a block, after the block wrote its float32 partial rows of `tiles_done` row tiles of column strip
// `strip` (each writer followed its stores with __threadfence()) and passed a __syncthreads: true in the block that
// completed the strip's last row tiles, whose thread 0 has reset the strip's counter. `completed` is the block's
// shared flag.
__device__ __forceinline__ bool strip_completed(unsigned int* counters, int64_t strip, int64_t row_tiles,
                                                unsigned int tiles_done, bool is_first_thread, bool& completed) {
  if (is_first_thread) {
    unsigned int* counter = counters + kFirstStripCounter + strip;
    const bool last = atomicAdd(counter, tiles_done) + tiles_done == static_cast<unsigned int>(row_tiles);
    if (last) {
      __threadfence();  // the other blocks' partial rows are visible to this block's reads below
      *counter = 0;
    }
    completed = last;
  }
  __syncthreads();
  return completed;
}

// column_sum[c] = the row tiles' float32 partials of column c added in row order, rounded once to T (the order the
// separate column-sum kernel used). The partials were written by other blocks: read through L2.
template <typename T>
__device__ __forceinline__ void write_column_sum(const float* column_partials, T* column_sum, int64_t row_tiles,
                                                 int64_t cols, int64_t c) {
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t tile = 0; tile < row_tiles; ++tile) sum += __ldcg(column_partials + tile * cols + c);
  column_sum[c] = from_float<T>(sum);
}

}  // namespace ge2::quantize_fp8
