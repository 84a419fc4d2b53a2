// The strided copy kernels and their launcher (strided_copy.hpp has the plan). The general kernel walks the shape in
// row-major order of dst's dims with 4 items per thread in flight, and a 32-bit index with fast division when the
// shape has fewer than 2^31 elements (a 64-bit one otherwise); long unit-stride rows that are not 16-byte aligned take
// the row kernel. Include this from one translation unit per module: every
// includer compiles all of the kernel's instantiations.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "fast_divmod.hpp"
#include "status.hpp"
#include "strided_copy.hpp"

namespace ge2 {

// Kernel arguments: the copy's shape as divisors, its strides, its size. Passed by value (about 300 bytes).
struct StridedCopyParams {
  int rank = 0;
  FastDivmod shape[kMaxDims];
  int64_t src_strides[kMaxDims] = {};
  int64_t dst_strides[kMaxDims] = {};
  int64_t numel = 0;
};

// Offsets of the element with row-major linear index `index`; the outermost dim needs no division.
template <typename Index>
__device__ __forceinline__ void strided_offsets(const StridedCopyParams& p, Index index, int64_t& src, int64_t& dst) {
  src = 0;
  dst = 0;
#pragma unroll
  for (int k = kMaxDims - 1; k >= 1; --k) {
    if (k < p.rank) {
      Index coordinate;
      index = p.shape[k].divmod(index, coordinate);
      src += static_cast<int64_t>(coordinate) * p.src_strides[k];
      dst += static_cast<int64_t>(coordinate) * p.dst_strides[k];
    }
  }
  if (p.rank > 0) {
    src += static_cast<int64_t>(index) * p.src_strides[0];
    dst += static_cast<int64_t>(index) * p.dst_strides[0];
  }
}

template <typename Unit, typename Index>
__global__ void __launch_bounds__(kCopyThreads)
    strided_copy_kernel(const Unit* __restrict__ src, Unit* __restrict__ dst, StridedCopyParams p) {
  const Index numel = static_cast<Index>(p.numel);
  const Index step = static_cast<Index>(gridDim.x) * kCopyThreads * kCopyItems;
  for (Index base = static_cast<Index>(blockIdx.x) * kCopyThreads * kCopyItems + threadIdx.x; base < numel;
       base += step) {
    Unit values[kCopyItems];
    int64_t dst_offsets[kCopyItems];
#pragma unroll
    for (int item = 0; item < kCopyItems; ++item) {
      const Index index = base + item * kCopyThreads;
      if (index < numel) {
        int64_t src_offset;
        strided_offsets(p, index, src_offset, dst_offsets[item]);
        values[item] = src[src_offset];
      }
    }
#pragma unroll
    for (int item = 0; item < kCopyItems; ++item) {
      if (base + item * kCopyThreads < numel) dst[dst_offsets[item]] = values[item];
    }
  }
}

// Long rows that are unit-stride on both sides but not 16-byte aligned (e.g. the first 50257 of every 50304 logits
// in float16), which the kernel above could only move element by element: each row is written in 16-byte stores at
// dst's aligned addresses, each fed by two aligned 16-byte loads of src shifted into place; the bytes before dst's
// first aligned address and after the last whole vector move one by one. A work item is a chunk of
// kRowChunkVectors vectors of one row.
constexpr int kRowVectorsPerThread = 4;
constexpr int64_t kRowChunkVectors = int64_t{kCopyThreads} * kRowVectorsPerThread;
constexpr int64_t kRowCopyMinBytes = int64_t{kCopyThreads} * 16;  // shorter rows would leave most threads idle

struct RowCopyParams {
  int outer_rank = 0;  // the dims above the rows
  int64_t outer_shape[kMaxDims] = {};
  int64_t src_strides[kMaxDims] = {};  // in bytes
  int64_t dst_strides[kMaxDims] = {};
  int64_t row_bytes = 0;
  int64_t rows = 0;
  int64_t chunks = 0;  // per row
};

// Bytes shift..shift+15 of the 32-byte stream lo:hi (little-endian), with Word = shift / 4 fixed at compile time so
// the words stay in registers.
template <int Word>
__device__ __forceinline__ uint4 shifted_words(const uint32_t (&w)[8], unsigned bits) {
  return make_uint4(__funnelshift_r(w[Word], w[Word + 1], bits), __funnelshift_r(w[Word + 1], w[Word + 2], bits),
                    __funnelshift_r(w[Word + 2], w[Word + 3], bits), __funnelshift_r(w[Word + 3], w[Word + 4], bits));
}

__device__ __forceinline__ uint4 funnel_shift_bytes(uint4 lo, uint4 hi, int shift) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const unsigned bits = static_cast<unsigned>(shift & 3) * 8;
  switch (shift >> 2) {
    case 0: return shifted_words<0>(w, bits);
    case 1: return shifted_words<1>(w, bits);
    case 2: return shifted_words<2>(w, bits);
    default: return shifted_words<3>(w, bits);
  }
}

__global__ void __launch_bounds__(kCopyThreads)
    row_copy_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, RowCopyParams p) {
  const int64_t work = p.rows * p.chunks;
  for (int64_t item = blockIdx.x; item < work; item += gridDim.x) {
    const int64_t row = item / p.chunks, chunk = item - row * p.chunks;
    int64_t src_offset = 0, dst_offset = 0, rest = row;
    for (int k = p.outer_rank - 1; k >= 0; --k) {
      const int64_t coordinate = rest % p.outer_shape[k];
      rest /= p.outer_shape[k];
      src_offset += coordinate * p.src_strides[k];
      dst_offset += coordinate * p.dst_strides[k];
    }
    const uint8_t* row_src = src + src_offset;
    uint8_t* row_dst = dst + dst_offset;
    const int64_t length = p.row_bytes;
    const int head = static_cast<int>((16 - (reinterpret_cast<std::uintptr_t>(row_dst) & 15)) & 15);
    const int shift = static_cast<int>((reinterpret_cast<std::uintptr_t>(row_src) + head) & 15);
    // A shifted vector's second load reads 16 - shift bytes past it: those bytes must still be the row's.
    const int64_t room = length - head - (shift == 0 ? 0 : 16 - shift);
    const int64_t vectors = room > 0 ? room / 16 : 0;
    const uint4* aligned_src = reinterpret_cast<const uint4*>(row_src + head - shift);
    uint4* aligned_dst = reinterpret_cast<uint4*>(row_dst + head);
    const int64_t first = chunk * kRowChunkVectors + threadIdx.x;
    uint4 lo[kRowVectorsPerThread], hi[kRowVectorsPerThread];
#pragma unroll
    for (int i = 0; i < kRowVectorsPerThread; ++i) {
      const int64_t v = first + i * kCopyThreads;
      if (v < vectors) {
        lo[i] = __ldg(aligned_src + v);
        hi[i] = shift == 0 ? lo[i] : __ldg(aligned_src + v + 1);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowVectorsPerThread; ++i) {
      const int64_t v = first + i * kCopyThreads;
      if (v < vectors) aligned_dst[v] = funnel_shift_bytes(lo[i], hi[i], shift);
    }
    if (chunk == 0 && threadIdx.x < head && threadIdx.x < length) row_dst[threadIdx.x] = row_src[threadIdx.x];
    const int64_t tail = head + vectors * 16 + threadIdx.x;  // fewer than 48 bytes: one byte per thread
    if (chunk == p.chunks - 1 && tail < length && tail >= head) row_dst[tail] = row_src[tail];
  }
}

// The row path of launch_strided_copy: `copy` is simplified, its innermost dim unit-stride on both sides.
inline void launch_row_copy(const void* src, void* dst, const StridedCopy& copy, int element_bytes,
                            cudaStream_t stream) {
  RowCopyParams params;
  params.outer_rank = copy.rank - 1;
  params.rows = 1;
  for (int k = 0; k < params.outer_rank; ++k) {
    params.outer_shape[k] = copy.shape[k];
    params.src_strides[k] = copy.src_strides[k] * element_bytes;
    params.dst_strides[k] = copy.dst_strides[k] * element_bytes;
    params.rows *= copy.shape[k];
  }
  params.row_bytes = copy.shape[copy.rank - 1] * element_bytes;
  params.chunks = (params.row_bytes / 16 + kRowChunkVectors) / kRowChunkVectors;  // covers every row's vectors
  row_copy_kernel<<<grid_for(params.rows * params.chunks, 1), kCopyThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), params);
  check_cuda(cudaGetLastError(), GE2_OP_NAME, "launch of row_copy_kernel");
}

// Enqueues dst[i] = src[i] for `copy` (strides in elements, pointers at the first element of each side).
inline void launch_strided_copy(const void* src, void* dst, const StridedCopy& copy, int element_bytes,
                                cudaStream_t stream) {
  const StridedCopy simple = simplified(copy);
  const int64_t numel = simple.numel();
  if (numel == 0) return;
  if (is_contiguous_run(simple)) {
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(numel) * element_bytes, cudaMemcpyDeviceToDevice,
                               stream),
               GE2_OP_NAME, "cudaMemcpyAsync");
    return;
  }
  const int width = access_bytes(simple, element_bytes, src, dst);
  const int inner = simple.rank - 1;
  if (width < 16 && simple.rank >= 2 && simple.src_strides[inner] == 1 && simple.dst_strides[inner] == 1 &&
      simple.shape[inner] * element_bytes >= kRowCopyMinBytes) {
    launch_row_copy(src, dst, simple, element_bytes, stream);
    return;
  }
  const StridedCopy units = in_units(simple, element_bytes, width);
  StridedCopyParams params;
  params.rank = units.rank;
  params.numel = units.numel();
  for (int k = 0; k < units.rank; ++k) {
    params.shape[k] = FastDivmod(units.shape[k]);
    params.src_strides[k] = units.src_strides[k];
    params.dst_strides[k] = units.dst_strides[k];
  }
  const unsigned blocks = grid_for(params.numel, kCopyThreads * kCopyItems);
  const bool narrow = params.numel < (int64_t{1} << 31);
  GE2_DISPATCH_UNIT(width, {
    const auto* typed_src = static_cast<const Unit*>(src);
    auto* typed_dst = static_cast<Unit*>(dst);
    if (narrow) {
      strided_copy_kernel<Unit, uint32_t><<<blocks, kCopyThreads, 0, stream>>>(typed_src, typed_dst, params);
    } else {
      strided_copy_kernel<Unit, uint64_t><<<blocks, kCopyThreads, 0, stream>>>(typed_src, typed_dst, params);
    }
  });
  check_cuda(cudaGetLastError(), GE2_OP_NAME, "launch of strided_copy_kernel");
}

}  // namespace ge2
