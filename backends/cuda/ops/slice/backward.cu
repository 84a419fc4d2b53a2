// slice backward: dx = zeros of x's shape with dx[slice] = dy, in one pass over dx. Threads take dx in order
// (coalesced writes) and ask, axis by axis, whether an element lies on the slice: its coordinate c must satisfy
// c = first + q * |step| with q < count, and dy's coordinate is q (or count - 1 - q for a negative step). Elements
// off the slice get zero. That moves |dx| + |dy| bytes, against |dx| + 2 |dy| for a memset followed by a scatter.
//
// Axes that the slice keeps whole (start 0, step 1, every element) need no test, and neighbouring whole axes merge.
// The outer axes are tested once per vector of dx's innermost axis; then
//   - whole_kernel:  the innermost axis is whole and unit-stride in dy, so a vector of dx is a vector of dy (or
//                    zeros): 16-byte units where extents, strides and pointers allow;
//   - masked_kernel: otherwise each thread still writes a vector of up to 16 bytes of dx, testing its elements one
//                    by one (a fast division each) and loading the ones on the slice. A step on the innermost axis
//                    (x[:, ::2]) thus costs a few instructions per element instead of a full index decomposition.
#include <string>
#include <vector>

#include "api.hpp"
#include "fast_divmod.hpp"
#include "status.hpp"
#include "strided_copy.hpp"
#include "vector_access.hpp"

namespace ge2::slice {
namespace {

struct Axis {
  int64_t extent, first, step, count, dy_stride;  // first: smallest coordinate on the slice; step: |step|
  bool reversed;
  bool whole() const { return first == 0 && step == 1 && count == extent && !reversed; }
};

struct ScatterParams {
  int outer_rank = 0;  // the axes before the innermost one
  FastDivmod outer_shape[kMaxDims];
  FastDivmod outer_step[kMaxDims];
  int64_t outer_first[kMaxDims] = {};
  int64_t outer_count[kMaxDims] = {};
  int64_t outer_dy_strides[kMaxDims] = {};
  uint32_t outer_reversed = 0;  // bit k: the slice runs backwards along outer axis k
  FastDivmod inner_vectors;     // vectors (or units) along the innermost axis
  FastDivmod inner_step;
  int64_t inner_first = 0, inner_count = 0, inner_dy_stride = 0;
  bool inner_reversed = false;
  int64_t numel = 0;  // vectors (or units) of dx
};

// Whether outer index `outer` (row-major over the outer axes) lies on the slice; then dy_offset is its dy offset.
template <typename Index>
__device__ __forceinline__ bool locate_outer(const ScatterParams& p, Index outer, int64_t& dy_offset) {
  dy_offset = 0;
#pragma unroll
  for (int k = kMaxDims - 1; k >= 0; --k) {
    if (k < p.outer_rank) {
      Index coordinate = outer;
      if (k > 0) outer = p.outer_shape[k].divmod(outer, coordinate);
      const int64_t offset = static_cast<int64_t>(coordinate) - p.outer_first[k];
      if (offset < 0) return false;
      Index remainder;
      const Index q = p.outer_step[k].divmod(static_cast<Index>(offset), remainder);
      if (remainder != 0 || static_cast<int64_t>(q) >= p.outer_count[k]) return false;
      const int64_t position = (p.outer_reversed >> k) & 1u ? p.outer_count[k] - 1 - static_cast<int64_t>(q)
                                                               : static_cast<int64_t>(q);
      dy_offset += position * p.outer_dy_strides[k];
    }
  }
  return true;
}

template <typename Unit, typename Index>
__global__ void __launch_bounds__(kCopyThreads) whole_kernel(const Unit* __restrict__ dy, Unit* __restrict__ dx,
                                                             ScatterParams p) {
  const Index numel = static_cast<Index>(p.numel);
  const Index step = static_cast<Index>(gridDim.x) * kCopyThreads * kCopyItems;
  for (Index base = static_cast<Index>(blockIdx.x) * kCopyThreads * kCopyItems + threadIdx.x; base < numel;
       base += step) {
    Unit values[kCopyItems];
#pragma unroll
    for (int item = 0; item < kCopyItems; ++item) {
      const Index index = base + item * kCopyThreads;
      values[item] = Unit{};
      if (index < numel) {
        Index column;
        const Index outer = p.inner_vectors.divmod(index, column);
        int64_t dy_offset;
        if (locate_outer(p, outer, dy_offset)) values[item] = dy[dy_offset + static_cast<int64_t>(column)];
      }
    }
#pragma unroll
    for (int item = 0; item < kCopyItems; ++item) {
      const Index index = base + item * kCopyThreads;
      if (index < numel) dx[index] = values[item];
    }
  }
}

template <typename Element, int kVector, typename Index>
__global__ void __launch_bounds__(kCopyThreads) masked_kernel(const Element* __restrict__ dy,
                                                              Element* __restrict__ dx, ScatterParams p) {
  const Index numel = static_cast<Index>(p.numel);
  for (Index index = static_cast<Index>(blockIdx.x) * kCopyThreads + threadIdx.x; index < numel;
       index += static_cast<Index>(gridDim.x) * kCopyThreads) {
    Index vector;
    const Index outer = p.inner_vectors.divmod(index, vector);
    int64_t dy_offset;
    const bool outer_inside = locate_outer(p, outer, dy_offset);
    const int64_t first_offset = static_cast<int64_t>(vector) * kVector - p.inner_first;
    Pack<Element, kVector> pack;
#pragma unroll
    for (int e = 0; e < kVector; ++e) {
      const int64_t offset = first_offset + e;
      Index remainder = 1, q = 0;
      if (outer_inside && offset >= 0) q = p.inner_step.divmod(static_cast<Index>(offset), remainder);
      const bool inside = remainder == 0 && static_cast<int64_t>(q) < p.inner_count;
      const int64_t position = p.inner_reversed ? p.inner_count - 1 - static_cast<int64_t>(q)
                                                : static_cast<int64_t>(q);
      pack.values[e] = inside ? dy[dy_offset + position * p.inner_dy_stride] : Element{};
    }
    store_pack<Element, kVector>(dx + static_cast<int64_t>(index) * kVector, pack);
  }
}

// x's axes as the kernels see them: extent-1 axes dropped, neighbouring whole axes merged.
std::vector<Axis> scatter_axes(const Geometry& geometry, const int64_t* dy_strides) {
  std::vector<Axis> axes;
  for (int k = 0; k < geometry.rank; ++k) {
    if (geometry.x_shape[k] == 1) continue;  // the slice takes its only element
    const int64_t count = geometry.y_shape[k];
    const bool reversed = geometry.steps[k] < 0 && count > 1;
    const int64_t step = count > 1 ? (reversed ? -geometry.steps[k] : geometry.steps[k]) : 1;
    const int64_t first = reversed ? geometry.starts[k] + (count - 1) * geometry.steps[k] : geometry.starts[k];
    const Axis axis{geometry.x_shape[k], first, step, count, dy_strides[k], reversed};
    if (!axes.empty() && axes.back().whole() && axis.whole() &&
        axes.back().dy_stride == axis.dy_stride * axis.extent) {
      axes.back().extent *= axis.extent;
      axes.back().count = axes.back().extent;
      axes.back().dy_stride = axis.dy_stride;
      continue;
    }
    axes.push_back(axis);
  }
  return axes;
}

// Outer axes (all but the last) into the kernel arguments; `ratio` elements per unit divide their dy strides.
ScatterParams outer_params(const std::vector<Axis>& axes, int64_t ratio) {
  ScatterParams params;
  params.outer_rank = static_cast<int>(axes.size()) - 1;
  for (int k = 0; k < params.outer_rank; ++k) {
    params.outer_shape[k] = FastDivmod(axes[k].extent);
    params.outer_step[k] = FastDivmod(axes[k].step);
    params.outer_first[k] = axes[k].first;
    params.outer_count[k] = axes[k].count;
    params.outer_dy_strides[k] = axes[k].dy_stride / ratio;
    if (axes[k].reversed) params.outer_reversed |= 1u << k;
  }
  return params;
}

// The innermost axis is whole and unit-stride in dy: dx and dy move in units of up to 16 bytes.
void launch_whole(const void* dy, void* dx, const std::vector<Axis>& axes, int element_bytes, cudaStream_t stream) {
  int width = element_bytes;
  for (int candidate = 16; candidate > element_bytes; candidate /= 2) {
    bool fits = (axes.back().extent * element_bytes) % candidate == 0 && is_aligned(dy, candidate) &&
                is_aligned(dx, candidate);
    for (std::size_t k = 0; k + 1 < axes.size() && fits; ++k) fits = (axes[k].dy_stride * element_bytes) % candidate == 0;
    if (fits) {
      width = candidate;
      break;
    }
  }
  const int64_t ratio = width / element_bytes;
  ScatterParams params = outer_params(axes, ratio);
  params.inner_vectors = FastDivmod(axes.back().extent / ratio);
  params.numel = (axes.back().extent / ratio);
  for (int k = 0; k < params.outer_rank; ++k) params.numel *= axes[k].extent;
  const unsigned blocks = grid_for(params.numel, kCopyThreads * kCopyItems);
  const bool narrow = params.numel < (int64_t{1} << 31);
  GE2_DISPATCH_UNIT(width, {
    const auto* typed_dy = static_cast<const Unit*>(dy);
    auto* typed_dx = static_cast<Unit*>(dx);
    if (narrow) {
      whole_kernel<Unit, uint32_t><<<blocks, kCopyThreads, 0, stream>>>(typed_dy, typed_dx, params);
    } else {
      whole_kernel<Unit, uint64_t><<<blocks, kCopyThreads, 0, stream>>>(typed_dy, typed_dx, params);
    }
  });
  GE2_CHECK_LAUNCH("slice backward whole_kernel");
}

template <typename Element, int kVector>
void launch_masked_typed(const void* dy, void* dx, const ScatterParams& params, cudaStream_t stream) {
  const unsigned blocks = grid_for(params.numel, kCopyThreads);
  const auto* typed_dy = static_cast<const Element*>(dy);
  auto* typed_dx = static_cast<Element*>(dx);
  if (params.numel < (int64_t{1} << 31)) {
    masked_kernel<Element, kVector, uint32_t><<<blocks, kCopyThreads, 0, stream>>>(typed_dy, typed_dx, params);
  } else {
    masked_kernel<Element, kVector, uint64_t><<<blocks, kCopyThreads, 0, stream>>>(typed_dy, typed_dx, params);
  }
}

// Launches the widest vector, from kVector down, that is at most `vector` elements.
template <typename Element, int kVector>
void launch_masked_vector(int vector, const void* dy, void* dx, const ScatterParams& params, cudaStream_t stream) {
  if constexpr (kVector > 1) {
    if (vector < kVector) return launch_masked_vector<Element, kVector / 2>(vector, dy, dx, params, stream);
  }
  launch_masked_typed<Element, kVector>(dy, dx, params, stream);
}

// Elements per dx vector: 16 bytes' worth, halved until it divides the innermost extent and dx's alignment.
template <typename Element>
void launch_masked_elements(const void* dy, void* dx, ScatterParams& params, int64_t inner_extent,
                            cudaStream_t stream) {
  constexpr int kWidest = 16 / static_cast<int>(sizeof(Element));
  int vector = kWidest;
  while (vector > 1 && (inner_extent % vector != 0 || !is_aligned(dx, vector * sizeof(Element)))) vector /= 2;
  params.inner_vectors = FastDivmod(inner_extent / vector);
  params.numel = inner_extent / vector;
  for (int k = 0; k < params.outer_rank; ++k) params.numel *= params.outer_shape[k].divisor;
  launch_masked_vector<Element, kWidest>(vector, dy, dx, params, stream);
}

void launch_masked(const void* dy, void* dx, const std::vector<Axis>& axes, int element_bytes, cudaStream_t stream) {
  ScatterParams params = outer_params(axes, 1);
  const Axis& inner = axes.back();
  params.inner_step = FastDivmod(inner.step);
  params.inner_first = inner.first;
  params.inner_count = inner.count;
  params.inner_dy_stride = inner.dy_stride;
  params.inner_reversed = inner.reversed;
  switch (element_bytes) {
    case 1: launch_masked_elements<uint8_t>(dy, dx, params, inner.extent, stream); break;
    case 2: launch_masked_elements<uint16_t>(dy, dx, params, inner.extent, stream); break;
    case 4: launch_masked_elements<uint32_t>(dy, dx, params, inner.extent, stream); break;
    case 8: launch_masked_elements<uint64_t>(dy, dx, params, inner.extent, stream); break;
    default: throw std::logic_error("slice backward: element size must be 1, 2, 4 or 8 bytes");
  }
  GE2_CHECK_LAUNCH("slice backward masked_kernel");
}

}  // namespace

void backward(const void* dy, const int64_t* dy_strides, void* dx, const Geometry& geometry, DType dtype,
              cudaStream_t stream) {
  check_geometry(geometry);
  int64_t dx_numel = 1, dy_numel = 1;
  for (int k = 0; k < geometry.rank; ++k) {
    dx_numel *= geometry.x_shape[k];
    dy_numel *= geometry.y_shape[k];
  }
  if (dx_numel == 0) return;
  if (dx == nullptr) throw std::invalid_argument("dx: null device pointer");
  const int element_bytes = static_cast<int>(dtype_size(dtype));
  if (dy_numel == 0) {  // an empty slice: no gradient reaches x
    GE2_CUDA_CHECK(cudaMemsetAsync(dx, 0, static_cast<std::size_t>(dx_numel) * element_bytes, stream));
    return;
  }
  if (dy == nullptr) throw std::invalid_argument("dy: null device pointer");
  const std::vector<Axis> axes = scatter_axes(geometry, dy_strides);
  if (axes.empty() || (axes.size() == 1 && axes[0].whole() && axes[0].dy_stride == 1)) {  // the slice is all of x
    GE2_CUDA_CHECK(cudaMemcpyAsync(dx, dy, static_cast<std::size_t>(dx_numel) * element_bytes,
                                   cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (axes.back().whole() && axes.back().dy_stride == 1) {
    launch_whole(dy, dx, axes, element_bytes, stream);
  } else {
    launch_masked(dy, dx, axes, element_bytes, stream);
  }
}

}  // namespace ge2::slice
