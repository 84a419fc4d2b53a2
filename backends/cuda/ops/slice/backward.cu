// slice backward: dx = zeros of x's shape with dx[slice] = dy, in one pass over dx. Each thread takes dx elements
// in order (coalesced writes) and asks, axis by axis, whether the element lies on the slice: its coordinate c must
// satisfy c = first + q * |step| with q < count, and dy's coordinate is q (or count - 1 - q for a negative step).
// Elements off the slice get zero. That moves |dx| + |dy| bytes, against |dx| + 2 |dy| for a memset followed by a
// scatter of dy.
//
// Axes that the slice keeps whole (start 0, step 1, every element) need no test; neighbouring whole axes merge,
// and when the innermost axis is whole the elements widen to 16-byte units where extents and pointers allow.
#include <string>
#include <vector>

#include "api.hpp"
#include "fast_divmod.hpp"
#include "status.hpp"
#include "strided_copy.hpp"
#include "vector_access.hpp"

namespace ge2::slice {
namespace {

struct ScatterParams {
  int rank = 0;
  FastDivmod dx_shape[kMaxDims];
  FastDivmod step[kMaxDims];  // |step|
  int64_t first[kMaxDims] = {};  // smallest dx coordinate on the slice
  int64_t count[kMaxDims] = {};
  int64_t dy_strides[kMaxDims] = {};
  uint32_t reversed_mask = 0;  // bit k: the slice runs backwards along axis k
  int64_t numel = 0;           // dx's units
};

// True when dx element `index` lies on the slice; then `dy_offset` is where its value is in dy.
template <typename Index>
__device__ __forceinline__ bool locate(const ScatterParams& p, Index index, int64_t& dy_offset) {
  dy_offset = 0;
#pragma unroll
  for (int k = kMaxDims - 1; k >= 0; --k) {
    if (k < p.rank) {
      Index coordinate = index;
      if (k > 0) index = p.dx_shape[k].divmod(index, coordinate);
      const int64_t offset = static_cast<int64_t>(coordinate) - p.first[k];
      if (offset < 0) return false;
      Index remainder;
      const Index q = p.step[k].divmod(static_cast<Index>(offset), remainder);
      if (remainder != 0 || static_cast<int64_t>(q) >= p.count[k]) return false;
      const int64_t position = (p.reversed_mask >> k) & 1u ? p.count[k] - 1 - static_cast<int64_t>(q)
                                                             : static_cast<int64_t>(q);
      dy_offset += position * p.dy_strides[k];
    }
  }
  return true;
}

template <typename Unit, typename Index>
__global__ void __launch_bounds__(kCopyThreads) slice_backward_kernel(const Unit* __restrict__ dy,
                                                                       Unit* __restrict__ dx, ScatterParams p) {
  const Index numel = static_cast<Index>(p.numel);
  const Index step = static_cast<Index>(gridDim.x) * kCopyThreads * kCopyItems;
  for (Index base = static_cast<Index>(blockIdx.x) * kCopyThreads * kCopyItems + threadIdx.x; base < numel;
       base += step) {
    Unit values[kCopyItems];
#pragma unroll
    for (int item = 0; item < kCopyItems; ++item) {
      const Index index = base + item * kCopyThreads;
      int64_t dy_offset;
      values[item] = Unit{};
      if (index < numel && locate(p, index, dy_offset)) values[item] = dy[dy_offset];
    }
#pragma unroll
    for (int item = 0; item < kCopyItems; ++item) {
      const Index index = base + item * kCopyThreads;
      if (index < numel) dx[index] = values[item];
    }
  }
}

struct Axis {
  int64_t extent, first, step, count, dy_stride;
  bool reversed;
  bool whole() const { return first == 0 && step == 1 && count == extent && !reversed; }
};

// x's axes as the kernel sees them: extent-1 axes dropped, neighbouring whole axes merged.
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

// Bytes per unit: up to 16 when the innermost axis is whole and unit-stride in dy, and extents, strides and
// pointers divide.
int unit_bytes(const std::vector<Axis>& axes, int element_bytes, const void* dy, const void* dx) {
  if (axes.empty() || !axes.back().whole() || axes.back().dy_stride != 1) return element_bytes;
  for (int width = 16; width > element_bytes; width /= 2) {
    bool fits = (axes.back().extent * element_bytes) % width == 0 && is_aligned(dy, width) && is_aligned(dx, width);
    for (std::size_t k = 0; k + 1 < axes.size() && fits; ++k) fits = (axes[k].dy_stride * element_bytes) % width == 0;
    if (fits) return width;
  }
  return element_bytes;
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
  std::vector<Axis> axes = scatter_axes(geometry, dy_strides);
  if (axes.empty() || (axes.size() == 1 && axes[0].whole() && axes[0].dy_stride == 1)) {  // the slice is all of x
    GE2_CUDA_CHECK(cudaMemcpyAsync(dx, dy, static_cast<std::size_t>(dx_numel) * element_bytes,
                                   cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const int width = unit_bytes(axes, element_bytes, dy, dx);
  const int64_t ratio = width / element_bytes;
  ScatterParams params;
  params.rank = static_cast<int>(axes.size());
  params.numel = dx_numel / ratio;
  for (int k = 0; k < params.rank; ++k) {
    Axis axis = axes[k];
    if (k == params.rank - 1 && ratio > 1) {
      axis.extent /= ratio;
      axis.count = axis.extent;
    } else if (ratio > 1) {
      axis.dy_stride /= ratio;
    }
    params.dx_shape[k] = FastDivmod(axis.extent);
    params.step[k] = FastDivmod(axis.step);
    params.first[k] = axis.first;
    params.count[k] = axis.count;
    params.dy_strides[k] = axis.dy_stride;
    if (axis.reversed) params.reversed_mask |= 1u << k;
  }
  const unsigned blocks = grid_for(params.numel, kCopyThreads * kCopyItems);
  const bool narrow = params.numel < (int64_t{1} << 31);
  GE2_DISPATCH_UNIT(width, {
    const auto* typed_dy = static_cast<const Unit*>(dy);
    auto* typed_dx = static_cast<Unit*>(dx);
    if (narrow) {
      slice_backward_kernel<Unit, uint32_t><<<blocks, kCopyThreads, 0, stream>>>(typed_dy, typed_dx, params);
    } else {
      slice_backward_kernel<Unit, uint64_t><<<blocks, kCopyThreads, 0, stream>>>(typed_dy, typed_dx, params);
    }
  });
  GE2_CHECK_LAUNCH("slice_backward_kernel");
}

}  // namespace ge2::slice
