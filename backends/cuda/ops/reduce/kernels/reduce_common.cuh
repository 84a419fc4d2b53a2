// Pieces every reduce kernel file shares: the combine operators, their host dispatch, launch sizes, and the index
// maps of the generic kernels.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "api.hpp"
#include "reduction.hpp"
#include "storage_dispatch.hpp"

namespace ge2::reduce {

// Maximum that propagates NaN (NumPy's max; fmaxf would drop it), with -inf as the identity so that a slice of
// -inf reduces to -inf.
struct NanMaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
  static constexpr float identity() { return -std::numeric_limits<float>::infinity(); }
};

// Calls launch(op) with SumOp for sum and mean (mean scales the sum) and NanMaxOp for max.
template <typename Launch>
void dispatch_reduction(Reduction reduction, Launch&& launch) {
  if (reduction == Reduction::Max) {
    launch(NanMaxOp());
  } else {
    launch(SumOp());
  }
}

// What the combined value is multiplied by before it is stored: 1 / count for mean, 1 otherwise.
inline float output_scale(Reduction reduction, int64_t count) {
  return reduction == Reduction::Mean ? static_cast<float>(1.0 / static_cast<double>(count)) : 1.0f;
}

// Grid-stride kernels launch at most this many blocks; more work loops.
constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;

inline unsigned grid_blocks(int64_t work_items, int64_t items_per_block) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((work_items + items_per_block - 1) / items_per_block, kMaxGridBlocks)));
}

inline int next_power_of_two(int64_t value) {
  int result = 1;
  while (result < value && result < (1 << 30)) result *= 2;
  return result;
}

// ---- generic index maps ----------------------------------------------------------------------------------------
// A set of dims (extents and the element strides of x along them) walked in row-major order: offset_of(i) is the
// x offset of the i-th multi-index.
struct DimWalk {
  int ndim = 0;
  int64_t extent[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};

  __host__ __device__ __forceinline__ int64_t offset_of(int64_t index) const {
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      offset += (index % extent[d]) * stride[d];
      index /= extent[d];
    }
    return offset;
  }
};

// The kept dims (in order: output index -> x offset of its first element) and the reduced dims (reduced index ->
// x offset from there) of a layout.
struct GenericMaps {
  DimWalk kept;
  DimWalk reduced;
};

inline GenericMaps generic_maps(const Layout& layout) {
  GenericMaps maps;
  int64_t stride = 1;
  int64_t strides[kMaxDims] = {};
  for (int d = layout.ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= layout.extent[d];
  }
  for (int d = 0; d < layout.ndim; ++d) {
    DimWalk& walk = layout.reduced[d] ? maps.reduced : maps.kept;
    walk.extent[walk.ndim] = layout.extent[d];
    walk.stride[walk.ndim] = strides[d];
    ++walk.ndim;
  }
  return maps;
}

}  // namespace ge2::reduce
