// flash: pieces shared by the tensor-core forward and backward kernels (sm_80+ instructions: cp.async, ldmatrix,
// mma.sync m16n8k16 with float32 accumulation). Tiles of rows x kHeadDim 16-bit values live in shared memory with
// their 16-byte chunks XOR-swizzled by (row & 7), so that the 8 row addresses of one ldmatrix hit 8 different bank
// groups whatever the row pitch (128 or 256 bytes).
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4): A (16x16) a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..),
// a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..); B (16x8, k x n) b0 = (k 2t..2t+1, n g), b1 = (k 2t + 8.., n g);
// C (16x8) c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..). Two C tiles side by side are one A fragment, which is how
// probabilities go from one product into the next without shared memory.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../api.hpp"

namespace ge2::attention::flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// c tanh(x / c) (the logit soft cap) in the log2 domain, as 1 - 2 / (2^(2 log2e |x| / c) + 1) on the fast exp2 and
// reciprocal: a few instructions and registers where tanhf takes dozens (the backward kernel is at its register
// limit). Its absolute error, about 2^-23 c near 0 and below that elsewhere, is far below a 16-bit P's rounding.
__device__ __forceinline__ float softcap_log2(float x, float cap) {
  const float tanh_abs = 1.0f - __fdividef(2.0f, exp2f(2.0f * kLog2e * fabsf(x) / cap) + 1.0f);
  return copysignf(cap * kLog2e * tanh_abs, x);
}

// One step of the online softmax for a row held by a quad of threads (an mma accumulator row: 4 lanes, xor 1 and 2):
// `tile_max` is this thread's max of the row's new scores (log2 domain, -inf where masked). Updates `row_max` to the
// running max and returns the base the new scores are exponentiated against (0 while the row has seen nothing, so
// exp2(-inf - base) = 0) and the correction the old sum and output are multiplied by.
struct RowRescale {
  float base, correction;
};
__device__ __forceinline__ RowRescale rescale_row(float& row_max, float tile_max) {
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float new_max = fmaxf(row_max, tile_max);
  const float base = new_max == -INFINITY ? 0.0f : new_max;
  const float correction = exp2f(row_max - base);
  row_max = new_max;
  return {base, correction};
}

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void copy_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// 4 bytes global -> shared, zero-filled when !valid.
__device__ __forceinline__ void copy_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of the most recently committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void load_matrix_x4_transposed(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a b on one m16n8k16 tile, float32 accumulators.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                   uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to T, `low` in the low 16 bits (the lower column of a fragment pair).
template <typename T>
__device__ __forceinline__ uint32_t pack(float low, float high);

template <>
__device__ __forceinline__ uint32_t pack<__half>(float low, float high) {
  __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<uint32_t*>(&pair);
}

template <>
__device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float low, float high) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<uint32_t*>(&pair);
}

// The A fragment of k-step kk from C tiles 2kk and 2kk + 1 (16 rows x 16 columns of a float32 product).
template <typename T>
__device__ __forceinline__ void to_a_fragment(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = pack<T>(left[0], left[1]);
  a[1] = pack<T>(left[2], left[3]);
  a[2] = pack<T>(right[0], right[1]);
  a[3] = pack<T>(right[2], right[3]);
}

// Element offset of 16-bit value (row, column) in a swizzled tile with kColumns values per row.
template <int kColumns>
__device__ __forceinline__ int swizzled(int row, int column) {
  return row * kColumns + ((((column >> 3) ^ row) & 7) | ((column >> 3) & ~7)) * 8 + (column & 7);
}

// Lane addresses for ldmatrix x4 on a swizzled tile (first row, first column of the 16x16 block):
// a_operand: the A fragment of rows [row0, row0 + 16) x columns [col0, col0 + 16) stored row-major;
// b_rows: two B fragments (n-tiles row0 and row0 + 8) from a tile stored [n][k] (k = columns, not transposed);
// b_columns: two B fragments (n-tiles col0 and col0 + 8) from a tile stored [k][n] (use the transposing load).
template <int kColumns>
__device__ __forceinline__ int a_operand(int lane, int row0, int col0) {
  return swizzled<kColumns>(row0 + (lane & 15), col0 + (lane >> 4) * 8);
}
template <int kColumns>
__device__ __forceinline__ int b_rows(int lane, int row0, int col0) {
  return swizzled<kColumns>(row0 + (lane & 7) + ((lane >> 4) << 3), col0 + ((lane >> 3) & 1) * 8);
}
template <int kColumns>
__device__ __forceinline__ int b_columns(int lane, int row0, int col0) {
  return swizzled<kColumns>(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, col0 + (lane >> 4) * 8);
}
// The A fragment of the transpose of a tile stored [k][m] (rows = k): use the transposing load.
template <int kColumns>
__device__ __forceinline__ int a_transposed(int lane, int k0, int m0) {
  return swizzled<kColumns>(k0 + (lane & 7) + ((lane >> 4) << 3), m0 + ((lane >> 3) & 1) * 8);
}

// Starts copying rows [0, kRows) of a [rows][kHeadDim] block (row pitch `pitch` elements) into a swizzled shared
// tile; rows at or beyond `valid_rows` read as zero.
template <int kRows, int kHeadDim, int kThreads, typename T>
__device__ __forceinline__ void copy_tile(T* tile, const T* source, int64_t pitch, int64_t valid_rows) {
  constexpr int kChunks = kHeadDim / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile copy: chunks must split evenly over the threads");
#pragma unroll
  for (int step = 0; step < kRows * kChunks / kThreads; ++step) {
    const int index = step * kThreads + static_cast<int>(threadIdx.x);
    const int row = index / kChunks, chunk = index % kChunks;
    const bool valid = row < valid_rows;
    const T* from = valid ? source + row * pitch + chunk * 8 : source;
    copy_16(shared_address(tile + swizzled<kHeadDim>(row, chunk * 8)), from, valid);
  }
}

// Element offset of row 0 of (batch b, head) and the pitch between rows, in either layout.
struct RowAddressing {
  int64_t base, pitch;
};
__device__ __forceinline__ RowAddressing rows_of(const Shape& s, int64_t b, int64_t head, int64_t heads, int64_t seq) {
  if (s.seq_major) return {(b * seq * heads + head) * s.head_dim, heads * s.head_dim};
  return {(b * heads + head) * seq * s.head_dim, s.head_dim};
}

}  // namespace ge2::attention::flash
