// quantize_fp8_transpose: y = FP8(x * scale) and its transpose y_t, with amax = max |x|, in one pass over a 2-d x
// (Transformer Engine's cast-transpose). FP8 training needs both layouts of x and dY (cuBLASLt's FP8 matmul takes
// only TN): writing both from one read of x saves a separate transpose's read and write.
// Two kernels:
//   1. wide (rows and cols multiples of 64, x and preact aligned to 16 bytes, y to 8 and y_t to 16, act none, gelu
//      or silu: every FP8 GEMM operand of a transformer): 64 x 64 tiles, 256 threads; a thread converts 8
//      consecutive elements of two rows, stores their 8 FP8 bytes into y with one 8-byte store, and after the tile
//      is in shared memory gathers 16 bytes of a tile column into one 16-byte store of y_t (4 threads write a
//      64-byte run of a y_t row). One wave of resident blocks, each a run of consecutive row tiles of one column
//      strip, its loads running up to three tiles ahead through a ring of cp.async stages in shared memory. The
//      activation is a template argument.
//   2. scalar (any shape, alignment and activation): 32 x 32 tiles, 32 x 8 threads, one element per thread and load.
// With a column sum (a linear layer's dbias, Transformer Engine's cast-transpose-dbias): each thread also sums its
// unquantized values, the tile's partial rows are added in shared memory and written as one float32 row of partials
// [row tiles, cols]; the block that writes the last row tile of a column strip then adds each of its columns'
// partials in row order (no atomics on the sums: the same sums every run, and no second kernel).
// The amax: per block, one atomicMax into a stream counter; the last block writes it (grid_completion.cuh).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "api.hpp"
#include "cp_async.hpp"
#include "grid_completion.cuh"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::quantize_fp8 {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

// One column block of x: its first column of x, its width and its rows (contiguous).
struct ColumnBlockView {
  const void* data;
  int64_t start, cols;
};

// x's column blocks, by value in the kernel parameters: block b holds x's columns [end[b - 1], end[b]) (from 0 for
// block 0), its rows of that width contiguous at data[b] (one block: x itself).
struct XBlocks {
  const void* data[kMaxColumnBlocks];
  int64_t end[kMaxColumnBlocks];
  int count;

  // The block holding `column`, chosen with constant indices only (a dynamic index into a parameter array would
  // copy the parameters to local memory).
  __device__ __forceinline__ ColumnBlockView locate(int64_t column) const {
    ColumnBlockView view{data[0], 0, end[0]};
#pragma unroll
    for (int b = 1; b < kMaxColumnBlocks; ++b) {
      if (b < count && column >= end[b - 1]) view = {data[b], end[b - 1], end[b] - end[b - 1]};
    }
    return view;
  }
};

// The value a quantize takes from x (and preact, when has_preact): x, act(x), or x * act'(preact) (see api.hpp).
__device__ __forceinline__ float prologue(float x, float preact, bool has_preact, Act act) {
  if (act == Act::None) return x;
  return has_preact ? x * act_derivative(act, preact, 0.0f) : apply_act(act, x, 0.0f);
}

// With addend (float32 x, one block): s = x + addend goes to sum_out, and the value quantized is s rounded to Value
// (what a float32 add followed by a cast to Value gives); column_sum is of Value (In otherwise).
template <typename In, typename Out, typename Value>
__global__ void __launch_bounds__(kTile * kRowsPerPass)
    quantize_transpose_kernel(XBlocks x, const In* __restrict__ preact, Act act,
                              const float* __restrict__ scale_pointer, Out* __restrict__ y, Out* __restrict__ y_t,
                              float* __restrict__ amax, float* __restrict__ column_partials,
                              Value* __restrict__ column_sum, unsigned int* __restrict__ counters, int64_t rows,
                              int64_t cols, const float* __restrict__ addend, float* __restrict__ sum_out) {
  __shared__ Out tile[kTile][kTile + 1];
  __shared__ float partial_rows[kRowsPerPass][kTile];
  __shared__ unsigned int warp_amax[kRowsPerPass];
  __shared__ bool strip_done;
  const bool first_thread = threadIdx.x == 0 && threadIdx.y == 0;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
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
        const ColumnBlockView block = x.locate(c);
        const int64_t i = r * cols + c;  // preact comes with one block only
        const In x_value = static_cast<const In*>(block.data)[r * block.cols + c - block.start];
        float value;
        if (addend != nullptr) {
          const float s = to_float(x_value) + addend[i];
          sum_out[i] = s;
          value = to_float(from_float<Value>(s));
        } else {
          value = prologue(to_float(x_value), preact != nullptr ? to_float(preact[i]) : 0.0f, preact != nullptr,
                           act);
        }
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
      __threadfence();  // before this tile counts as done in its column strip
    }
    for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
      const int64_t r = col0 + j, c = row0 + threadIdx.x;  // y_t[r, c] = y[c, r]
      if (r < cols && c < rows) y_t[r * rows + c] = tile[threadIdx.x][j];
    }
    __syncthreads();  // the tile is rewritten by the next iteration
    if (column_partials != nullptr &&
        strip_completed(counters, col0 / kTile, row_tiles, 1u, first_thread, strip_done) && threadIdx.y == 0 &&
        col0 + threadIdx.x < cols) {
      write_column_sum(column_partials, column_sum, row_tiles, cols, col0 + threadIdx.x);
    }
  }
  amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
  if (threadIdx.x == 0) warp_amax[threadIdx.y] = amax_bits;
  __syncthreads();
  if (first_thread) {
    for (int w = 1; w < kRowsPerPass; ++w) amax_bits = max(amax_bits, warp_amax[w]);
    finish_amax(amax_bits, counters, amax);
  }
}

constexpr int kWideTile = 64;
constexpr int kWideThreads = 256;
constexpr int kVector = 8;
constexpr int kWideRowsPerPass = kWideThreads / (kWideTile / kVector);  // 32: a tile takes two passes of rows
constexpr int kWidePasses = kWideTile / kWideRowsPerPass;
// Shared-memory row stride of the FP8 tile: 68 bytes keeps 4-byte stores aligned and spreads the column gathers of
// a warp over more banks than a 64- or 72-byte stride (2-way conflicts at most).
constexpr int kWideStride = kWideTile + 4;
// Bytes of y_t a thread gathers from a tile column and stores at once: 4 threads write a 64-byte run of a y_t row.
constexpr int kTransposeVector = 16;

// The activations the wide kernel is compiled for: FP8 training's prologues (GELU, SiLU); other activations take the
// element-wise kernel.
constexpr bool wide_prologue(Act act) { return act == Act::None || act == Act::Gelu || act == Act::Silu; }

// The loads run ahead through a ring of stages in shared memory, each a tile of x (and of preact): cp.async copies
// issued kCount - 1 tiles ahead of the one converted, so a block keeps up to three quarters of kStageBudget in flight
// without registers to hold them.
// A 16-bit tile is 8 KB: four stages for a plain cast, two with preact (or a float32 x); float32 with preact
// (32 KB a stage) would not fit twice under the 48 KB of static shared memory and takes the element-wise kernel.
constexpr int kStageBudget = 32 * 1024;
constexpr int kMaxStageBytes = kStageBudget / 2;

constexpr int stage_bytes(std::size_t x_bytes, bool with_preact) {
  return kWideTile * kWideTile * static_cast<int>(x_bytes) * (with_preact ? 2 : 1);
}

// The add variant (float32 x and addend: 32 KB a stage) takes two stages in dynamic shared memory instead.
constexpr int kAddStageBudget = 64 * 1024;

template <typename In, bool kPreact, bool kAdd = false>
struct WideStages {
  static constexpr int kBytes = stage_bytes(sizeof(In), kPreact || kAdd);  // a stage: x's tile, then preact's
  static constexpr int kCount = (kAdd ? kAddStageBudget : kStageBudget) / kBytes;
  static constexpr bool kDynamic = kAdd;  // the ring in dynamic shared memory (past the 48 KB of static)
  static_assert(kCount >= 2, "a stage ring needs two stages: one loading, one converting");
};

// The logistic function from the SFU's exponential and an approximate division: within a few float32 ulps (0 once
// e^-v passes 2^126, where the exact value is below 2^-126), in a fraction of expf's and a division's instructions.
__device__ __forceinline__ float fast_sigmoid(float v) { return __fdividef(1.0f, 1.0f + __expf(-v)); }

// GELU (tanh form) and SiLU and their derivatives through fast_sigmoid, for the wide kernel: 0.5 (1 + tanh u) is
// sigmoid(2u), so GELU(z) = z s and GELU'(z) = s + 2 z s (1 - s) u', with u = sqrt(2/pi) (z + 0.044715 z^3) and
// s = sigmoid(2u). A few float32 ulps from activation.hpp's tanhf and expf formulas (the element-wise kernel's), far
// below an FP8 ulp: with those formulas GELU's quantizes were issue-bound (about 35 of 50 instructions a value).
__device__ __forceinline__ float gelu_gate(float z) {
  return fast_sigmoid(2.0f * kSqrt2OverPi * (z + kGeluCubic * z * z * z));
}
template <Act kAct>
__device__ __forceinline__ float fast_act(float z) {
  if constexpr (kAct == Act::Gelu) {
    return z * gelu_gate(z);
  } else {
    static_assert(kAct == Act::Silu, "the wide kernel's prologues: none, gelu, silu");
    return z * fast_sigmoid(z);
  }
}
template <Act kAct>
__device__ __forceinline__ float fast_act_derivative(float z) {
  if constexpr (kAct == Act::Gelu) {
    const float s = gelu_gate(z);
    return s + 2.0f * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * z * z) * z * s * (1.0f - s);
  } else {
    static_assert(kAct == Act::Silu, "the wide kernel's prologues: none, gelu, silu");
    const float s = fast_sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
  }
}

// What the wide kernel quantizes, with the activation and the preact read known at compile time: x, act(x) or
// x * act'(preact), without `prologue`'s switch. (With `act` at run time each of a thread's 16 values a tile carried
// every activation's code and its branches: GELU's backward ran at a quarter of copy bandwidth.)
template <Act kAct, bool kPreact>
__device__ __forceinline__ float wide_prologue_value(float x, float preact) {
  if constexpr (kAct == Act::None) {
    return x;
  } else if constexpr (kPreact) {
    return x * fast_act_derivative<kAct>(preact);
  } else {
    return fast_act<kAct>(x);
  }
}

template <typename T, int N>
struct alignas(sizeof(T) * N > 16 ? 16 : sizeof(T) * N) Pack {
  T value[N];
};

// A vector of x as float32 values: a bfloat16 pair widens from its 32-bit word with one shift and one mask (the
// element-wise conversion extracted each half first, two instructions a value); other dtypes through to_float.
template <typename In>
__device__ __forceinline__ void widen(const Pack<In, kVector>& pack, float (&values)[kVector]) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    const auto* words = reinterpret_cast<const unsigned int*>(&pack);
#pragma unroll
    for (int i = 0; i < kVector / 2; ++i) {
      values[2 * i] = __uint_as_float(words[i] << 16);
      values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVector; ++i) values[i] = to_float(pack.value[i]);
  }
}

// Offset (in elements) of a thread's 8 elements of pass `pass` within a row-major 64 x 64 tile.
__device__ __forceinline__ int tile_offset(int pass, int pass_row, int lane_vector) {
  return (pass * kWideRowsPerPass + pass_row) * kWideTile + lane_vector * kVector;
}

// A thread's source vectors in x (or preact) through a run's tiles: its vector of the first pass of the next tile to
// copy, and the steps (in elements) to its second pass and to the next tile.
template <typename In>
struct RunCursor {
  const In* next;
  int64_t pass_step, tile_step;

  __device__ __forceinline__ RunCursor(const In* rows, int64_t row_width, int64_t first_row, int64_t column)
      : next(rows + first_row * row_width + column),
        pass_step(kWideRowsPerPass * row_width),
        tile_step(kWideTile * row_width) {}
};

// A thread's copies of the next tile of its run into a stage, advancing the cursors: exactly the 8-element vectors
// of x (and of preact) it converts later, so the data it waits for is its own copies' and needs no barrier between
// the wait and the reads.
template <typename In, bool kPreact>
__device__ __forceinline__ void copy_tile(unsigned char* stage, RunCursor<In>& x, RunCursor<In>& preact,
                                          int lane_vector, int pass_row) {
  constexpr int kPieces = kVector * sizeof(In) / 16;  // 16-byte copies per 8-element vector
#pragma unroll
  for (int pass = 0; pass < kWidePasses; ++pass) {
    const auto* x_vector = reinterpret_cast<const unsigned char*>(x.next + pass * x.pass_step);
    unsigned char* x_tile = stage + tile_offset(pass, pass_row, lane_vector) * sizeof(In);
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece) {
      cp_async_16(smem_address(x_tile + 16 * piece), reinterpret_cast<uint64_t>(x_vector + 16 * piece), true);
      if constexpr (kPreact) {
        const auto* preact_vector = reinterpret_cast<const unsigned char*>(preact.next + pass * preact.pass_step);
        cp_async_16(smem_address(x_tile + stage_bytes(sizeof(In), false) + 16 * piece),
                    reinterpret_cast<uint64_t>(preact_vector + 16 * piece), true);
      }
    }
  }
  x.next += x.tile_step;
  if constexpr (kPreact) preact.next += preact.tile_step;
}

// Row tiles of partials the completing block stages in shared memory at a time: the whole stage ring, idle by then
// (128 row tiles, one L2 round trip for a GPT-2 step's 8192 rows).
constexpr int kStagedTiles = kStageBudget / (kWideTile * sizeof(float));

// The completing block's column sums of its strip (64 columns): each column's row-tile partials added in row order
// from 0, rounded once to In (write_column_sum's additions). The partials, written by other blocks, come through L2
// into shared memory kStagedTiles row tiles at a time, every thread's copies in flight together (one round trip a
// round, not a chain of them), and no registers held for them (they would set the whole kernel's count).
template <typename Value>
__device__ __forceinline__ void write_strip_column_sums(const float* column_partials, Value* column_sum,
                                                        int64_t row_tiles, int64_t cols, int64_t col0,
                                                        float (*staged)[kWideTile]) {
  constexpr int kPieces = kWideTile * sizeof(float) / 16;  // 16-byte pieces of a tile's partial row
  float sum = 0.0f;
  for (int64_t base = 0; base < row_tiles; base += kStagedTiles) {
    const int count = static_cast<int>(min(static_cast<int64_t>(kStagedTiles), row_tiles - base));
    for (int piece = threadIdx.x; piece < count * kPieces; piece += kWideThreads) {
      const int tile = piece / kPieces, offset = piece % kPieces * 4;
      cp_async_16(smem_address(&staged[tile][offset]),
                  reinterpret_cast<uint64_t>(column_partials + (base + tile) * cols + col0 + offset), true);
    }
    cp_async_wait_all();
    __syncthreads();
    if (threadIdx.x < kWideTile) {
      for (int tile = 0; tile < count; ++tile) sum += staged[tile][threadIdx.x];
    }
    __syncthreads();  // read before the next round's copies
  }
  if (threadIdx.x < kWideTile) column_sum[col0 + threadIdx.x] = from_float<Value>(sum);
}

// The 64 x 64 kernel. A block takes a run of `run_tiles` consecutive row tiles of one column strip (blocks ordered
// strip first, so the blocks running together read whole rows of x); its loads run kCount - 1 tiles ahead through
// the stage ring while it converts one tile and transposes it through shared memory. With a column sum, each tile's
// partial row is written with a plain store, and the block fences once and counts its run into the strip's counter
// once, after the run (a fence and an atomic after every tile stalled each block for their round trips); the block
// that completes a strip adds its columns' partials.
// kAdd (float32 x): preact is the addend, s = x + addend goes to sum_out and the value quantized is s rounded to Value
// (a float32 add and a cast to Value, bit for bit); column_sum is of Value (In otherwise).
template <typename In, typename Out, typename Value, bool kColumnSum, Act kAct, bool kPreact, bool kAdd>
__global__ void __launch_bounds__(kWideThreads)
    quantize_transpose_wide_kernel(XBlocks x_blocks, const In* __restrict__ preact,
                                   const float* __restrict__ scale_pointer, Out* __restrict__ y,
                                   Out* __restrict__ y_t, float* __restrict__ amax,
                                   float* __restrict__ column_partials, Value* __restrict__ column_sum,
                                   unsigned int* __restrict__ counters, int rows, int cols, int run_tiles,
                                   float* __restrict__ sum_out) {
  static_assert(sizeof(Out) == 1, "FP8 outputs are one byte");
  static_assert(!kAdd || (std::is_same_v<In, float> && !kPreact && kAct == Act::None),
                "the add prologue reads float32 x and its addend, no activation");
  using Stages = WideStages<In, kPreact, kAdd>;
  static_assert(Stages::kCount * Stages::kBytes >= kStagedTiles * kWideTile * sizeof(float),
                "the completing block's staged partials fit the stage ring");
  __shared__ __align__(16) unsigned char static_stages[Stages::kDynamic ? 1 : Stages::kCount * Stages::kBytes];
  extern __shared__ __align__(16) unsigned char dynamic_stages[];
  unsigned char* const ring = Stages::kDynamic ? dynamic_stages : static_stages;
  __shared__ __align__(16) unsigned char tile[kWideTile * kWideStride];
  __shared__ float partial_rows[kColumnSum ? kWideRowsPerPass : 1][kWideTile];  // a tile's partial rows
  __shared__ unsigned int warp_amax[kWideThreads / 32];
  __shared__ bool strip_done;
  const float scale = *scale_pointer;
  unsigned int amax_bits = 0;
  const int lane_vector = threadIdx.x % (kWideTile / kVector);  // which 8 columns of the tile this thread converts
  const int pass_row = threadIdx.x / (kWideTile / kVector);     // its row in each pass (0..31)
  const int strips = cols / kWideTile, row_tiles = rows / kWideTile;
  const int strip = static_cast<int>(blockIdx.x) % strips, col0 = strip * kWideTile;
  const int first_tile = static_cast<int>(blockIdx.x) / strips * run_tiles;  // < row_tiles: no empty run
  const int tiles = min(run_tiles, row_tiles - first_tile);
  const ColumnBlockView block = x_blocks.locate(col0);  // the strip's column block (widths: multiples of 64)
  const int64_t first_row = static_cast<int64_t>(first_tile) * kWideTile + pass_row;
  RunCursor<In> x_copies(static_cast<const In*>(block.data), block.cols, first_row,
                         col0 - block.start + lane_vector * kVector);
  RunCursor<In> preact_copies = x_copies;  // not read without preact (or addend)
  if constexpr (kPreact || kAdd) preact_copies = RunCursor<In>(preact, cols, first_row, col0 + lane_vector * kVector);
  // Tiles 0 .. kCount - 2 of the run in flight, each its own group (a group per tile, empty past the run's end, so
  // that "tile t has landed" is always "at most kCount - 2 groups pending" after the next tile's commit).
#pragma unroll
  for (int t = 0; t < Stages::kCount - 1; ++t) {
    if (t < tiles) {
      copy_tile<In, kPreact || kAdd>(ring + t * Stages::kBytes, x_copies, preact_copies, lane_vector, pass_row);
    }
    cp_async_commit();
  }
  cp_async_wait<Stages::kCount - 2>();  // tile 0 (each thread converts only what it copied itself)
  __syncthreads();                      // and a barrier the compiler keeps the stage reads below
  for (int t = 0; t < tiles; ++t) {
    const int64_t row0 = static_cast<int64_t>(first_tile + t) * kWideTile;
    // the stage tile t - 1 used, refilled kCount - 1 tiles ahead (this thread read its part before the last barrier)
    if (t + Stages::kCount - 1 < tiles) {
      copy_tile<In, kPreact || kAdd>(ring + (t + Stages::kCount - 1) % Stages::kCount * Stages::kBytes, x_copies,
                                     preact_copies, lane_vector, pass_row);
    }
    cp_async_commit();
    const unsigned char* stage = ring + t % Stages::kCount * Stages::kBytes;
    float column_partial[kVector] = {};
#pragma unroll
    for (int pass = 0; pass < kWidePasses; ++pass) {
      const int r = pass * kWideRowsPerPass + pass_row;
      const int offset = tile_offset(pass, pass_row, lane_vector);
      float x_values[kVector], preact_values[kVector] = {};
      widen<In>(*reinterpret_cast<const Pack<In, kVector>*>(reinterpret_cast<const In*>(stage) + offset), x_values);
      if constexpr (kPreact || kAdd) {
        widen<In>(*reinterpret_cast<const Pack<In, kVector>*>(
                      reinterpret_cast<const In*>(stage + stage_bytes(sizeof(In), false)) + offset),
                  preact_values);
      }
      if constexpr (kAdd) {  // the float32 sums, written as they are; their rounding to Value is quantized
        Pack<float, kVector / 2> sums[2];
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          const float s = x_values[i] + preact_values[i];
          sums[i / (kVector / 2)].value[i % (kVector / 2)] = s;
          x_values[i] = to_float(from_float<Value>(s));
        }
        auto* sums_row =
            reinterpret_cast<Pack<float, kVector / 2>*>(sum_out + (row0 + r) * cols + col0 + lane_vector * kVector);
        sums_row[0] = sums[0];
        sums_row[1] = sums[1];
      }
      Pack<Out, kVector> out;
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        const float value = wide_prologue_value<kAct, kPreact>(x_values[i], preact_values[i]);
        amax_bits = max(amax_bits, __float_as_uint(fabsf(value)));
        if constexpr (kColumnSum) column_partial[i] += value;
        out.value[i] = from_float<Out>(value * scale);
      }
      *reinterpret_cast<Pack<Out, kVector>*>(y + (row0 + r) * cols + col0 + lane_vector * kVector) = out;
      const auto* words = reinterpret_cast<const unsigned int*>(&out);
      auto* row = reinterpret_cast<unsigned int*>(tile + r * kWideStride + lane_vector * kVector);
      row[0] = words[0];
      row[1] = words[1];
    }
    if constexpr (kColumnSum) {
#pragma unroll
      for (int i = 0; i < kVector; ++i) partial_rows[pass_row][lane_vector * kVector + i] = column_partial[i];
    }
    __syncthreads();
    if constexpr (kColumnSum) {
      if (threadIdx.x < kWideTile) {  // the tile's 32 partial rows of column threadIdx.x, in row order
        float sum = 0.0f;
        for (int j = 0; j < kWideRowsPerPass; ++j) sum += partial_rows[j][threadIdx.x];
        column_partials[(first_tile + t) * static_cast<int64_t>(cols) + col0 + threadIdx.x] = sum;
      }
    }
    {  // y_t[col0 + c, row0 + 16 s .. row0 + 16 s + 15] = tile[16 s .. 16 s + 15][c]: one 16-byte store a thread
      static_assert(kWideTile * kWideTile == kWideThreads * kTransposeVector, "one y_t vector per thread a tile");
      constexpr int kSegments = kWideTile / kTransposeVector;  // 16-byte segments of a tile column
      const int segment = threadIdx.x % kSegments, c = threadIdx.x / kSegments;
      Pack<unsigned char, kTransposeVector> gathered;
#pragma unroll
      for (int i = 0; i < kTransposeVector; ++i) {
        gathered.value[i] = tile[(segment * kTransposeVector + i) * kWideStride + c];
      }
      *reinterpret_cast<Pack<unsigned char, kTransposeVector>*>(
          y_t + (col0 + c) * static_cast<int64_t>(rows) + row0 + segment * kTransposeVector) = gathered;
    }
    cp_async_wait<Stages::kCount - 2>();  // tile t + 1 has landed (this thread's copies of it)
    __syncthreads();  // the tile and the partial rows are rewritten by the next iteration, stage t refilled
  }
  if constexpr (kColumnSum) {
    if (threadIdx.x < kWideTile) __threadfence();  // the run's partial rows before its tiles count as done
    __syncthreads();                               // every writer's fence before thread 0 counts them
    if (strip_completed(counters, strip, row_tiles, static_cast<unsigned int>(tiles), threadIdx.x == 0,
                        strip_done)) {
      // the stage ring is idle: every copy landed (the groups past the run's end are empty) and was read
      write_strip_column_sums(column_partials, column_sum, row_tiles, cols, col0,
                              reinterpret_cast<float (*)[kWideTile]>(ring));
    }
  }
  amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWideThreads / 32; ++w) amax_bits = max(amax_bits, warp_amax[w]);
    finish_amax(amax_bits, counters, amax);
  }
}

// addend: the add variant (float32 x and addend, the sum 16-byte aligned), its two-stage ring in dynamic memory.
bool fits_wide(const XBlocks& x, const void* preact, DType x_dtype, const void* y, const void* y_t, int64_t rows,
               int64_t cols, Act act, const void* addend, const void* sum) {
  const auto aligned = [](const void* pointer, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
  };
  // a tile strip inside one block, 16-byte copies of 8-element vectors (16 bytes of 16-bit x, 32 of float32)
  for (int b = 0; b < x.count; ++b) {
    if (x.end[b] % kWideTile != 0 || !aligned(x.data[b], 16)) return false;
  }
  const bool stages_fit = addend != nullptr ? aligned(addend, 16) && aligned(sum, 16)
                                            : stage_bytes(dtype_size(x_dtype), preact != nullptr) <= kMaxStageBytes;
  // int tile indices and extents
  return rows % kWideTile == 0 && cols % kWideTile == 0 && rows <= INT32_MAX && cols <= INT32_MAX &&
         wide_prologue(act) && stages_fit && aligned(preact, 16) && aligned(y, kVector) &&
         aligned(y_t, kTransposeVector);
}

template <typename In, typename Out, typename Value>
using WideKernel = void (*)(XBlocks, const In*, const float*, Out*, Out*, float*, float*, Value*, unsigned int*, int,
                            int, int, float*);

// The instantiation for an activation with preact, where its stages fit (fits_wide admits no other).
template <typename In, typename Out, bool kColumnSum, Act kAct>
WideKernel<In, Out, In> wide_kernel_with_preact() {
  if constexpr (stage_bytes(sizeof(In), true) <= kMaxStageBytes) {
    return quantize_transpose_wide_kernel<In, Out, In, kColumnSum, kAct, true, false>;
  } else {
    return nullptr;
  }
}

template <typename In, typename Out, typename Value, bool kColumnSum>
WideKernel<In, Out, Value> wide_kernel(Act act, bool with_preact, bool with_addend) {
  if constexpr (std::is_same_v<In, float>) {
    if (with_addend) return quantize_transpose_wide_kernel<In, Out, Value, kColumnSum, Act::None, false, true>;
  }
  if constexpr (std::is_same_v<In, Value>) {
    switch (act) {
      case Act::Gelu:
        return with_preact ? wide_kernel_with_preact<In, Out, kColumnSum, Act::Gelu>()
                           : quantize_transpose_wide_kernel<In, Out, In, kColumnSum, Act::Gelu, false, false>;
      case Act::Silu:
        return with_preact ? wide_kernel_with_preact<In, Out, kColumnSum, Act::Silu>()
                           : quantize_transpose_wide_kernel<In, Out, In, kColumnSum, Act::Silu, false, false>;
      default:  // Act::None (fits_wide admits no other)
        return quantize_transpose_wide_kernel<In, Out, In, kColumnSum, Act::None, false, false>;
    }
  }
  return nullptr;  // Value differs from In only with an addend
}

template <typename In, typename Out, typename Value>
void launch(const XBlocks& x, const void* preact, Act act, const float* scale, void* y, void* y_t, float* amax,
            float* column_partials, void* column_sum, unsigned int* counters, int64_t rows, int64_t cols, bool wide,
            const float* addend, float* sum, cudaStream_t stream) {
  if (wide) {
    const bool with_addend = addend != nullptr;
    const WideKernel<In, Out, Value> kernel =
        column_partials != nullptr ? wide_kernel<In, Out, Value, true>(act, preact != nullptr, with_addend)
                                   : wide_kernel<In, Out, Value, false>(act, preact != nullptr, with_addend);
    // the add variant's ring: two 32 KB stages of dynamic shared memory (past the 48 KB a block gets by default)
    const int dynamic_bytes = with_addend ? kAddStageBudget : 0;
    if (with_addend) {
      GE2_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_bytes));
    }
    // one wave of resident blocks, each a run of the same number of row tiles (the last of a strip's runs shorter)
    int device = 0, sms = 0, resident = 0;
    GE2_CUDA_CHECK(cudaGetDevice(&device));
    GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    GE2_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kWideThreads, dynamic_bytes));
    const int64_t strips = cols / kWideTile, row_tiles = rows / kWideTile;
    const int64_t wave = std::max<int64_t>(1, static_cast<int64_t>(sms) * resident);
    const int64_t run_tiles = std::min(row_tiles, (strips * row_tiles + wave - 1) / wave);
    const int64_t runs = (row_tiles + run_tiles - 1) / run_tiles;
    kernel<<<static_cast<unsigned int>(strips * runs), kWideThreads, dynamic_bytes, stream>>>(
        x, with_addend ? reinterpret_cast<const In*>(addend) : static_cast<const In*>(preact), scale,
        static_cast<Out*>(y), static_cast<Out*>(y_t), amax, column_partials, static_cast<Value*>(column_sum),
        counters, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(run_tiles), sum);
    return;
  }
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const int blocks = static_cast<int>(std::min<int64_t>(tiles, 132 * 16));
  quantize_transpose_kernel<In, Out, Value><<<blocks, dim3(kTile, kRowsPerPass), 0, stream>>>(
      x, static_cast<const In*>(preact), act, scale, static_cast<Out*>(y),
      static_cast<Out*>(y_t), amax, column_partials, static_cast<Value*>(column_sum), counters, rows, cols, addend,
      sum);
}

// --- quantize_fp8_transpose_multi: several tensors' plain cast-transposes in one launch ---------------------------
// FP8 training quantizes every weight (47 of them for GPT-2 124M, 0.6 to 2.4 M elements each) with both layouts; one
// launch a weight left each at 0.6-1.7 TB/s (a launch, a ramp and one round trip of too few tiles for 132 SMs). Here
// the tensors' 64 x 64 tiles are numbered one after another and one wave of resident blocks takes equal runs of
// consecutive tiles, so all the tensors fill the GPU together. A tile's arithmetic is the wide kernel's (act none),
// so y, y_t and each amax are bit for bit those of one quantize_fp8_transpose per tensor. A block keeps a running
// amax while its tiles stay in one tensor and adds it into that tensor's counter when the run moves on to the next
// tensor (or ends); then the block counts itself done, and the launch's last block writes every tensor's amax and
// resets the counters (zero-kept stream scratch, as grid_completion.cuh's). A tensor whose shape or alignment does not
// allow the 8-element vectors converts its tiles element by element (partial tiles at its edges).

// One tensor of a launch. `wide`: rows and cols multiples of 64, x 16-byte, y 8-byte, y_t 16-byte aligned.
struct MultiTensor {
  const void* x;
  void* y;
  void* y_t;
  const float* scale;
  float* amax;
  int rows, cols;
  int first_tile;  // its first tile in the launch's numbering
  int wide;
};

// The tensors of a launch, by value (__grid_constant__: indexed in place, not copied to local memory).
struct MultiTable {
  MultiTensor tensor[kTensorsPerLaunch];
  int count;
  int tiles;      // all the tensors' tiles
  int run_tiles;  // consecutive tiles a block takes
};
static_assert(sizeof(MultiTable) + sizeof(void*) <= 4096, "kernel parameters are limited to 4 KB");

// counters[0]: blocks finished; counters[1 + k]: tensor k's amax so far (float bits).
constexpr int kMultiAmaxCounter = 1;

// The block's maximum of `amax_bits` added into tensor k's counter (every thread calls it, at the same point).
__device__ __forceinline__ void flush_tensor_amax(unsigned int amax_bits, int k, unsigned int* counters,
                                                  unsigned int* warp_amax) {
  amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWideThreads / 32; ++w) amax_bits = max(amax_bits, warp_amax[w]);
    if (amax_bits != 0) atomicMax(counters + kMultiAmaxCounter + k, amax_bits);
  }
  __syncthreads();  // warp_amax is rewritten by the next flush
}

// One 64 x 64 tile (row0, col0) of tensor t; amax_bits takes the maximum of its |x| bits. Ends with a barrier: the
// shared tile is free for the next one.
template <typename In, typename Out>
__device__ __forceinline__ void multi_tile(MultiTensor t, int64_t row0, int64_t col0, unsigned char* tile,
                                           unsigned int& amax_bits) {
  const In* x = static_cast<const In*>(t.x);
  Out* y = static_cast<Out*>(t.y);
  Out* y_t = static_cast<Out*>(t.y_t);
  const float scale = *t.scale;
  const int64_t rows = t.rows, cols = t.cols;
  if (t.wide) {
    const int lane_vector = threadIdx.x % (kWideTile / kVector);
    const int pass_row = threadIdx.x / (kWideTile / kVector);
    Pack<In, kVector> packs[kWidePasses];
#pragma unroll
    for (int pass = 0; pass < kWidePasses; ++pass) {  // both loads in flight together
      const int64_t r = row0 + pass * kWideRowsPerPass + pass_row;
      packs[pass] = *reinterpret_cast<const Pack<In, kVector>*>(x + r * cols + col0 + lane_vector * kVector);
    }
#pragma unroll
    for (int pass = 0; pass < kWidePasses; ++pass) {
      const int r = pass * kWideRowsPerPass + pass_row;
      float values[kVector];
      widen<In>(packs[pass], values);
      Pack<Out, kVector> out;
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        amax_bits = max(amax_bits, __float_as_uint(fabsf(values[i])));
        out.value[i] = from_float<Out>(values[i] * scale);
      }
      *reinterpret_cast<Pack<Out, kVector>*>(y + (row0 + r) * cols + col0 + lane_vector * kVector) = out;
      const auto* words = reinterpret_cast<const unsigned int*>(&out);
      auto* row = reinterpret_cast<unsigned int*>(tile + r * kWideStride + lane_vector * kVector);
      row[0] = words[0];
      row[1] = words[1];
    }
    __syncthreads();
    constexpr int kSegments = kWideTile / kTransposeVector;
    const int segment = threadIdx.x % kSegments, c = threadIdx.x / kSegments;
    Pack<unsigned char, kTransposeVector> gathered;
#pragma unroll
    for (int i = 0; i < kTransposeVector; ++i) gathered.value[i] = tile[(segment * kTransposeVector + i) * kWideStride + c];
    *reinterpret_cast<Pack<unsigned char, kTransposeVector>*>(y_t + (col0 + c) * rows + row0 +
                                                              segment * kTransposeVector) = gathered;
  } else {
    Out* tile_values = reinterpret_cast<Out*>(tile);
    for (int i = threadIdx.x; i < kWideTile * kWideTile; i += kWideThreads) {
      const int r = i / kWideTile, c = i % kWideTile;  // along y's rows
      if (row0 + r < rows && col0 + c < cols) {
        const float value = to_float(x[(row0 + r) * cols + col0 + c]);
        amax_bits = max(amax_bits, __float_as_uint(fabsf(value)));
        const Out q = from_float<Out>(value * scale);
        y[(row0 + r) * cols + col0 + c] = q;
        tile_values[r * kWideStride + c] = q;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kWideTile * kWideTile; i += kWideThreads) {
      const int c = i / kWideTile, r = i % kWideTile;  // along y_t's rows
      if (row0 + r < rows && col0 + c < cols) y_t[(col0 + c) * rows + row0 + r] = tile_values[r * kWideStride + c];
    }
  }
  __syncthreads();
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kWideThreads)
    quantize_transpose_multi_kernel(const __grid_constant__ MultiTable table, unsigned int* __restrict__ counters) {
  static_assert(sizeof(Out) == 1, "FP8 outputs are one byte");
  __shared__ __align__(16) unsigned char tile[kWideTile * kWideStride];
  __shared__ unsigned int warp_amax[kWideThreads / 32];
  __shared__ bool last_block;
  const int begin = static_cast<int>(blockIdx.x) * table.run_tiles;
  const int end = min(begin + table.run_tiles, table.tiles);
  int k = 0, last = table.count - 1;  // the tensor holding tile `begin`: the last one starting at or before it
  while (k < last) {                   // (an empty tensor starts where the next one does)
    const int middle = (k + last + 1) / 2;
    if (table.tensor[middle].first_tile <= begin) {
      k = middle;
    } else {
      last = middle - 1;
    }
  }
  unsigned int amax_bits = 0;  // this thread's maximum over tensor k's tiles so far
  for (int g = begin; g < end; ++g) {
    if (k + 1 < table.count && table.tensor[k + 1].first_tile <= g) {  // the run moves on to the next tensor
      flush_tensor_amax(amax_bits, k, counters, warp_amax);
      amax_bits = 0;
      while (k + 1 < table.count && table.tensor[k + 1].first_tile <= g) ++k;  // past empty tensors
    }
    const MultiTensor t = table.tensor[k];
    const int tiles_across = (t.cols + kWideTile - 1) / kWideTile;
    const int local = g - t.first_tile;
    multi_tile<In, Out>(t, static_cast<int64_t>(local / tiles_across) * kWideTile,
                        static_cast<int64_t>(local % tiles_across) * kWideTile, tile, amax_bits);
  }
  flush_tensor_amax(amax_bits, k, counters, warp_amax);
  if (threadIdx.x == 0) {
    __threadfence();  // this block's maxima are in before the block counts as finished
    last_block = atomicAdd(counters, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last_block) {
    __threadfence();
    for (int i = threadIdx.x; i < table.count; i += kWideThreads) {
      *table.tensor[i].amax = __uint_as_float(atomicExch(counters + kMultiAmaxCounter + i, 0u));
    }
    if (threadIdx.x == 0) counters[0] = 0;
  }
}

}  // namespace

void launch_quantize_transpose(const ColumnBlock* blocks, int block_count, DType x_dtype, const float* scale, void* y,
                               void* y_t, DType y_dtype, float* amax, void* column_sum, int64_t rows, int64_t cols,
                               Act act, const void* preact, const float* addend, float* sum, DType value_dtype,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) {  // no kernel: the amax of nothing is 0, and so are the sums over no rows
    GE2_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    if (column_sum != nullptr && cols > 0) {
      GE2_CUDA_CHECK(cudaMemsetAsync(column_sum, 0, static_cast<std::size_t>(cols) * dtype_size(value_dtype), stream));
    }
    return;
  }
  XBlocks x{{}, {}, block_count};
  for (int b = 0; b < block_count; ++b) {
    x.data[b] = blocks[b].data;
    x.end[b] = (b == 0 ? 0 : x.end[b - 1]) + blocks[b].cols;
  }
  const bool wide = fits_wide(x, preact, x_dtype, y, y_t, rows, cols, act, addend, sum);
  const int64_t tile = wide ? kWideTile : kTile;
  const int64_t row_tiles = (rows + tile - 1) / tile, column_strips = (cols + tile - 1) / tile;
  const std::size_t partial_bytes = static_cast<std::size_t>(row_tiles * cols) * sizeof(float);  // a row per tile
  float* column_partials =
      column_sum != nullptr ? static_cast<float*>(StreamWorkspace::get(partial_bytes, stream)) : nullptr;
  auto* counters = static_cast<unsigned int*>(
      StreamWorkspace::get_zeroed(counter_bytes(column_sum != nullptr ? column_strips : 0), stream));
  // In: x's type; Value: what the quantized values are rounded to (x's type, or with an addend value_dtype)
  const auto run = [&](auto in, auto value) {
    using In = decltype(in);
    using Value = decltype(value);
    if (y_dtype == DType::Float8E4M3) {
      launch<In, __nv_fp8_e4m3, Value>(x, preact, act, scale, y, y_t, amax, column_partials, column_sum, counters,
                                       rows, cols, wide, addend, sum, stream);
    } else {
      launch<In, __nv_fp8_e5m2, Value>(x, preact, act, scale, y, y_t, amax, column_partials, column_sum, counters,
                                       rows, cols, wide, addend, sum, stream);
    }
  };
  if (addend != nullptr) {  // float32 x (the launcher checks it)
    GE2_DISPATCH_FLOATING(value_dtype, "value dtype", run(float{}, scalar_t{}));
  } else {
    GE2_DISPATCH_FLOATING(x_dtype, "x dtype", run(scalar_t{}, scalar_t{}));
  }
  GE2_CHECK_LAUNCH("quantize_fp8_transpose");
}

}  // namespace ge2::quantize_fp8

namespace ge2::quantize_fp8 {

void launch_quantize_transpose_multi(const std::vector<MultiQuantize>& tensors, DType x_dtype, DType y_dtype,
                                     cudaStream_t stream) {
  const auto aligned = [](const void* pointer, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
  };
  auto* counters = static_cast<unsigned int*>(
      StreamWorkspace::get_zeroed((kMultiAmaxCounter + kTensorsPerLaunch) * sizeof(unsigned int), stream));
  int device = 0, sms = 0, resident = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GE2_DISPATCH_FLOATING(x_dtype, "x dtype", {  // the same resources for either FP8 format
    GE2_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &resident, quantize_transpose_multi_kernel<scalar_t, __nv_fp8_e4m3>, kWideThreads, 0));
  });
  const int64_t wave = std::max<int64_t>(1, static_cast<int64_t>(sms) * resident);
  for (std::size_t first = 0; first < tensors.size(); first += kTensorsPerLaunch) {
    const std::size_t count = std::min<std::size_t>(kTensorsPerLaunch, tensors.size() - first);
    MultiTable table{};
    int64_t tiles = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const MultiQuantize& q = tensors[first + i];
      const int64_t tile_count = ((q.rows + kWideTile - 1) / kWideTile) * ((q.cols + kWideTile - 1) / kWideTile);
      const bool wide = q.rows % kWideTile == 0 && q.cols % kWideTile == 0 && aligned(q.x, 16) &&
                        aligned(q.y, kVector) && aligned(q.y_t, kTransposeVector);
      table.tensor[i] = {q.x, q.y, q.y_t, q.scale, q.amax, static_cast<int>(q.rows), static_cast<int>(q.cols),
                         static_cast<int>(tiles), wide ? 1 : 0};
      tiles += tile_count;
      if (tiles > INT32_MAX) {
        throw std::invalid_argument("tensors: more than 2^31 - 1 tiles of 64 x 64 in one launch");
      }
    }
    table.count = static_cast<int>(count);
    table.tiles = static_cast<int>(tiles);
    // one wave of resident blocks, each a run of the same number of consecutive tiles (one block even for none)
    table.run_tiles = static_cast<int>(std::max<int64_t>(1, (tiles + wave - 1) / wave));
    const auto blocks = static_cast<unsigned int>(std::max<int64_t>(1, (tiles + table.run_tiles - 1) / table.run_tiles));
    GE2_DISPATCH_FLOATING(x_dtype, "x dtype", {
      if (y_dtype == DType::Float8E4M3) {
        quantize_transpose_multi_kernel<scalar_t, __nv_fp8_e4m3><<<blocks, kWideThreads, 0, stream>>>(table, counters);
      } else {
        quantize_transpose_multi_kernel<scalar_t, __nv_fp8_e5m2><<<blocks, kWideThreads, 0, stream>>>(table, counters);
      }
    });
    GE2_CHECK_LAUNCH("quantize_fp8_transpose_multi");
  }
}

}  // namespace ge2::quantize_fp8
