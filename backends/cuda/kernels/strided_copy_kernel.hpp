// The strided copy kernel and its launcher (strided_copy.hpp has the plan). The kernel walks the shape in row-major
// order of dst's dims with 4 items per thread in flight, and a 32-bit index with fast division when the shape has
// fewer than 2^31 elements (a 64-bit one otherwise). Include this from one translation unit per module: every
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
