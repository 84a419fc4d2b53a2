// The strided copy every data-movement op reduces to: dst[i] = src[i] for every multi-index i of one shape, each
// side with its own element strides (any sign, 0 included). transpose is a copy from permuted input strides, slice a
// copy from step-scaled strides, concat and split copies into and out of column ranges, reshape of a strided view a
// copy into a contiguous buffer.
//
// Before launching, the problem is simplified: extent-1 dims go, and neighbouring dims that are one run on both
// sides merge. What is left decides the path:
//   - one contiguous run on both sides: cudaMemcpyAsync (the copy ceiling, nothing to beat);
//   - innermost dim unit-stride on both sides: the element is widened to the largest access (up to 16 bytes) that
//     divides the innermost extent, every other stride and both pointers, so each thread moves 16-byte vectors;
//     rows of 4 KB or more that allow less than 16 bytes take a row kernel instead (16-byte stores at dst's aligned
//     addresses from shifted aligned loads of src);
//   - otherwise element by element.
// This header holds that plan (and the unit types and launch constants that other data-movement kernels share);
// strided_copy_kernel.hpp holds the kernel and its launcher. Data moves as raw bytes: the dtype only matters
// through its size.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "status.hpp"
#include "tensor_view.hpp"

namespace ge2 {

struct StridedCopy {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t src_strides[kMaxDims] = {};  // in elements
  int64_t dst_strides[kMaxDims] = {};

  int64_t numel() const {
    int64_t count = 1;
    for (int k = 0; k < rank; ++k) count *= shape[k];
    return count;
  }

  void append(int64_t extent, int64_t src_stride, int64_t dst_stride) {
    shape[rank] = extent;
    src_strides[rank] = src_stride;
    dst_strides[rank] = dst_stride;
    ++rank;
  }
};

// Same copy with extent-1 dims dropped and dims merged where the outer one steps exactly over the inner one on
// both sides. A single element becomes rank 0.
inline StridedCopy simplified(const StridedCopy& copy) {
  StridedCopy result;
  for (int k = 0; k < copy.rank; ++k) {
    if (copy.shape[k] == 1) continue;
    if (result.rank > 0) {
      const int outer = result.rank - 1;
      if (result.src_strides[outer] == copy.src_strides[k] * copy.shape[k] &&
          result.dst_strides[outer] == copy.dst_strides[k] * copy.shape[k]) {
        result.shape[outer] *= copy.shape[k];
        result.src_strides[outer] = copy.src_strides[k];
        result.dst_strides[outer] = copy.dst_strides[k];
        continue;
      }
    }
    result.append(copy.shape[k], copy.src_strides[k], copy.dst_strides[k]);
  }
  return result;
}

// True when a simplified copy is one contiguous run on both sides (a plain memcpy).
inline bool is_contiguous_run(const StridedCopy& copy) {
  return copy.rank == 0 || (copy.rank == 1 && copy.src_strides[0] == 1 && copy.dst_strides[0] == 1);
}

// Bytes per access for a simplified copy: the largest power of two up to 16 that keeps every access inside one
// unit-stride run and aligned, or the element size when the innermost dim is not unit-stride on both sides.
inline int access_bytes(const StridedCopy& copy, int element_bytes, const void* src, const void* dst) {
  const int inner = copy.rank - 1;
  if (copy.rank == 0 || copy.src_strides[inner] != 1 || copy.dst_strides[inner] != 1) return element_bytes;
  for (int width = 16; width > element_bytes; width /= 2) {
    const auto address_src = reinterpret_cast<std::uintptr_t>(src), address_dst = reinterpret_cast<std::uintptr_t>(dst);
    bool fits = (copy.shape[inner] * element_bytes) % width == 0 && address_src % width == 0 &&
                address_dst % width == 0;
    for (int k = 0; k < inner && fits; ++k) {
      fits = (copy.src_strides[k] * element_bytes) % width == 0 && (copy.dst_strides[k] * element_bytes) % width == 0;
    }
    if (fits) return width;
  }
  return element_bytes;
}

// The same copy in units of `width` bytes (width a multiple of the element size, as access_bytes returns).
inline StridedCopy in_units(StridedCopy copy, int element_bytes, int width) {
  const int64_t ratio = width / element_bytes;
  if (ratio == 1) return copy;
  const int inner = copy.rank - 1;
  copy.shape[inner] /= ratio;
  for (int k = 0; k < inner; ++k) {
    copy.src_strides[k] /= ratio;
    copy.dst_strides[k] /= ratio;
  }
  return copy;
}

// Storage type moved by one access of N bytes.
template <int N> struct UnitOf;
template <> struct UnitOf<1> { using type = uint8_t; };
template <> struct UnitOf<2> { using type = uint16_t; };
template <> struct UnitOf<4> { using type = uint32_t; };
template <> struct UnitOf<8> { using type = uint2; };
template <> struct UnitOf<16> { using type = uint4; };

// Runs `body` with `Unit` bound to the storage type of `bytes` (1, 2, 4, 8 or 16).
#define GE2_DISPATCH_UNIT(bytes, ...)                                             \
  switch (bytes) {                                                              \
    case 1: { using Unit = ::ge2::UnitOf<1>::type; __VA_ARGS__; break; }        \
    case 2: { using Unit = ::ge2::UnitOf<2>::type; __VA_ARGS__; break; }        \
    case 4: { using Unit = ::ge2::UnitOf<4>::type; __VA_ARGS__; break; }        \
    case 8: { using Unit = ::ge2::UnitOf<8>::type; __VA_ARGS__; break; }        \
    case 16: { using Unit = ::ge2::UnitOf<16>::type; __VA_ARGS__; break; }      \
    default: throw std::logic_error("access width must be 1, 2, 4, 8 or 16 bytes"); \
  }

constexpr int kCopyThreads = 256;
constexpr int kCopyItems = 4;  // per thread per step: loads of all items are issued before the first store

// Grid for `work` items spread over blocks of `per_block`: enough blocks to cover it, capped (the loops stride).
inline unsigned grid_for(int64_t work, int64_t per_block) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((work + per_block - 1) / per_block, 1 << 20)));
}

}  // namespace ge2
