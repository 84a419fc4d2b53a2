// The data-movement kernels of the indexing module: axis_map, gather, gather_nd and trilu. One thread per output
// element in a grid-stride loop; the output index is split into per-axis coordinates (row-major), each mapped to the
// input. They move elements by size (1, 2, 4 or 8 bytes), so every dtype takes them; writes are coalesced, reads
// follow the map (broadcast and padding reads hit the same rows repeatedly and stay in L2).
#include <algorithm>
#include <string>

#include "api.hpp"
#include "fast_divmod.hpp"
#include "status.hpp"

namespace ge2::indexing {
namespace {


// The input index along one axis, or -1 where the output element is the fill value.
template <typename Index>
__device__ __forceinline__ Index map_index(Index o, int mode, Index n, Index p) {
  switch (static_cast<AxisMode>(mode)) {
    case AxisMode::Offset: {
      const Index i = o - p;
      return (i >= 0 && i < n) ? i : -1;
    }
    case AxisMode::Reflect: {
      if (n == 1) return 0;
      const Index period = 2 * (n - 1);
      Index i = (o - p) % period;
      if (i < 0) i += period;
      return i < n ? i : period - i;
    }
    case AxisMode::Edge: {
      const Index i = o - p;
      return i < 0 ? 0 : (i >= n ? n - 1 : i);
    }
    case AxisMode::Wrap: {
      Index i = (o - p) % n;
      return i < 0 ? i + n : i;
    }
    case AxisMode::Divide:
      return o / p;
    case AxisMode::Modulo:
      return o % n;
  }
  return -1;
}

// Index: int32_t when x and y have fewer than 2^31 elements (32-bit division is several times cheaper than 64-bit,
// and the coordinate split is most of this kernel's work), else int64_t.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) axis_map_kernel(const T* __restrict__ x, T* __restrict__ y, AxisMap map,
                                                            int64_t count, T fill) {
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; linear < count;
       linear += static_cast<int64_t>(gridDim.x) * kThreads) {
    Index rest = static_cast<Index>(linear), offset = 0, stride = 1;
    bool inside = true;
    for (int axis = map.rank - 1; axis >= 0; --axis) {
      const Index extent = static_cast<Index>(map.y_shape[axis]);
      const Index o = rest % extent;
      rest /= extent;
      const Index i = map_index<Index>(o, map.modes[axis], static_cast<Index>(map.x_shape[axis]),
                                       static_cast<Index>(map.params[axis]));
      inside = inside && i >= 0;
      offset += i * stride;
      stride *= static_cast<Index>(map.x_shape[axis]);
    }
    y[linear] = inside ? x[offset] : fill;
  }
}

constexpr int kPadUnroll = 4;  // elements per thread and pass: their loads in flight together

// axis_map's constant pad or crop of the last axis alone, the axes before it merged into rows: [rows, x_cols] ->
// [rows, y_cols], y column c reading x column c - shift. One fast division per element where axis_map_kernel splits
// two coordinates by integer division and switches on each axis' mode, and kPadUnroll independent loads per thread
// where it waits on each: EfficientNet-B0's input, [32 * 224 * 224, 3] padded to 8 channels, took 69 us there (12%
// of the copy bandwidth, H200).
template <typename T>
__global__ void __launch_bounds__(kThreads) last_axis_pad_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                 FastDivmod y_cols, int32_t x_cols, int32_t shift,
                                                                 uint32_t count, T fill) {
  for (uint32_t first = blockIdx.x * kThreads * kPadUnroll + threadIdx.x; first < count;
       first += gridDim.x * kThreads * kPadUnroll) {
    T values[kPadUnroll];
#pragma unroll
    for (int k = 0; k < kPadUnroll; ++k) {
      const uint32_t linear = first + k * kThreads;
      uint32_t col = 0;
      const uint32_t row = linear < count ? y_cols.divmod(linear, col) : 0;
      const int32_t source = static_cast<int32_t>(col) - shift;
      values[k] = linear < count && source >= 0 && source < x_cols ? x[row * x_cols + source] : fill;
    }
#pragma unroll
    for (int k = 0; k < kPadUnroll; ++k) {
      if (first + k * kThreads < count) y[first + k * kThreads] = values[k];
    }
  }
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) gather_kernel(const T* __restrict__ x, const Index* __restrict__ indices,
                                                          T* __restrict__ y, GatherGeometry geometry, int64_t count,
                                                          T fill) {
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; linear < count;
       linear += static_cast<int64_t>(gridDim.x) * kThreads) {
    int64_t rest = linear, x_offset = 0, index_offset = 0;
    for (int axis = geometry.rank - 1; axis >= 0; --axis) {
      const int64_t o = rest % geometry.y_shape[axis];
      rest /= geometry.y_shape[axis];
      index_offset += o * geometry.index_strides[axis];
      if (axis != geometry.axis) x_offset += o * geometry.x_strides[axis];
    }
    int64_t index = static_cast<int64_t>(indices[index_offset]);
    if (index < 0) index += geometry.axis_extent;
    const bool inside = index >= 0 && index < geometry.axis_extent;
    y[linear] = inside ? x[x_offset + index * geometry.x_strides[geometry.axis]] : fill;
  }
}

// One index tuple per output row: the tuple's r components (each wrapped once from the end) address x's axes
// after the batch, the remaining output coordinates the rest of x.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) gather_nd_kernel(const T* __restrict__ x,
                                                             const Index* __restrict__ indices, T* __restrict__ y,
                                                             GatherNdGeometry geometry, int64_t count, T fill) {
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; linear < count;
       linear += static_cast<int64_t>(gridDim.x) * kThreads) {
    int64_t rest = linear, x_offset = 0, index_offset = 0;
    for (int axis = geometry.rank - 1; axis >= 0; --axis) {
      const int64_t o = rest % geometry.y_shape[axis];
      rest /= geometry.y_shape[axis];
      index_offset += o * geometry.index_strides[axis];
      x_offset += o * geometry.x_strides[axis];
    }
    bool inside = true;
    for (int component = 0; component < geometry.components; ++component) {
      int64_t index = static_cast<int64_t>(indices[index_offset + component]);
      if (index < 0) index += geometry.extents[component];
      inside = inside && index >= 0 && index < geometry.extents[component];
      x_offset += index * geometry.component_strides[component];
    }
    y[linear] = inside ? x[x_offset] : fill;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) trilu_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                         int64_t cols, int64_t k, bool upper, int64_t count) {
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; linear < count;
       linear += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t column = linear % cols;
    const int64_t row = (linear / cols) % rows;
    const int64_t diagonal = column - row;
    y[linear] = (upper ? diagonal >= k : diagonal <= k) ? x[linear] : T(0);
  }
}

// Runs the statement with `storage_t` the unsigned integer of `bytes` bytes.
#define GE2_DISPATCH_ELEMENT_SIZE(bytes, ...)                                                        \
  switch (bytes) {                                                                                 \
    case 1: { using storage_t = uint8_t; __VA_ARGS__; break; }                                     \
    case 2: { using storage_t = uint16_t; __VA_ARGS__; break; }                                    \
    case 4: { using storage_t = uint32_t; __VA_ARGS__; break; }                                    \
    case 8: { using storage_t = uint64_t; __VA_ARGS__; break; }                                    \
    default:                                                                                       \
      throw std::invalid_argument("element_bytes: expected 1, 2, 4 or 8, got " + std::to_string(bytes)); \
  }

// Runs the statement with `index_t` the indices' integer type (int32 or int64).
#define GE2_DISPATCH_INDEX(index_dtype, ...)                                                       \
  if ((index_dtype) == DType::Int32) {                                                             \
    using index_t = int32_t;                                                                       \
    __VA_ARGS__;                                                                                   \
  } else {                                                                                         \
    using index_t = int64_t;                                                                       \
    __VA_ARGS__;                                                                                   \
  }

int64_t product(const int64_t* shape, int rank) {
  int64_t count = 1;
  for (int axis = 0; axis < rank; ++axis) count *= shape[axis];
  return count;
}

// The byte every byte of the fill value is, or -1 when they differ (then no memset can write it).
int uniform_fill_byte(uint64_t fill_bits, int element_bytes) {
  const int byte = static_cast<int>(fill_bits & 0xff);
  for (int i = 1; i < element_bytes; ++i) {
    if (static_cast<int>((fill_bits >> (8 * i)) & 0xff) != byte) return -1;
  }
  return byte;
}

// A constant pad or crop of the leading axis alone (every other axis kept whole, fill bytes all alike): y's rows are
// x's moved by params[0] and the fill around them, so one contiguous copy and at most two memsets write it at copy
// bandwidth instead of an index map per element (pad_classes' LM-head weight, 77 MB, and its gradient's crop).
// Returns false, launching nothing, for any other map.
bool leading_rows_moved(const void* x, void* y, const AxisMap& map, int element_bytes, uint64_t fill_bits,
                        cudaStream_t stream) {
  const int fill_byte = uniform_fill_byte(fill_bits, element_bytes);
  if (map.rank < 1 || static_cast<AxisMode>(map.modes[0]) != AxisMode::Offset || fill_byte < 0) return false;
  for (int axis = 1; axis < map.rank; ++axis) {
    if (static_cast<AxisMode>(map.modes[axis]) != AxisMode::Offset || map.params[axis] != 0 ||
        map.x_shape[axis] != map.y_shape[axis]) {
      return false;
    }
  }
  const auto row_bytes = static_cast<std::size_t>(product(map.y_shape + 1, map.rank - 1) * element_bytes);
  const int64_t y_rows = map.y_shape[0], shift = map.params[0];  // y row r is x row r - shift
  const int64_t first = std::clamp<int64_t>(shift, 0, y_rows);  // y rows [first, last) are copied
  const int64_t last = std::clamp<int64_t>(map.x_shape[0] + shift, 0, y_rows);
  auto* y_bytes = static_cast<char*>(y);
  if (last > first) {
    GE2_CUDA_CHECK(cudaMemcpyAsync(y_bytes + first * row_bytes,
                                   static_cast<const char*>(x) + (first - shift) * row_bytes,
                                   (last - first) * row_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  if (first > 0) GE2_CUDA_CHECK(cudaMemsetAsync(y_bytes, fill_byte, first * row_bytes, stream));
  if (last < y_rows) {
    GE2_CUDA_CHECK(cudaMemsetAsync(y_bytes + last * row_bytes, fill_byte, (y_rows - last) * row_bytes, stream));
  }
  return true;
}

// The map with neighbouring axes that both copy x unchanged (offset 0, equal extents) merged into one: a channel pad
// of [N, H, W, 3] to [N, H, W, 8] is [N * H * W, 3] to [N * H * W, 8], one coordinate split instead of four.
AxisMap merge_identity_axes(const AxisMap& map) {
  const auto identity = [&](int axis) {
    return static_cast<AxisMode>(map.modes[axis]) == AxisMode::Offset && map.params[axis] == 0 &&
           map.x_shape[axis] == map.y_shape[axis];
  };
  AxisMap merged;
  for (int axis = 0; axis < map.rank; ++axis) {
    if (merged.rank > 0 && identity(axis) && identity(axis - 1)) {
      merged.x_shape[merged.rank - 1] *= map.x_shape[axis];
      merged.y_shape[merged.rank - 1] *= map.y_shape[axis];
      continue;
    }
    merged.x_shape[merged.rank] = map.x_shape[axis];
    merged.y_shape[merged.rank] = map.y_shape[axis];
    merged.modes[merged.rank] = map.modes[axis];
    merged.params[merged.rank] = map.params[axis];
    ++merged.rank;
  }
  return merged;
}

}  // namespace

void axis_map(const void* x, void* y, const AxisMap& map, int element_bytes, uint64_t fill_bits,
              cudaStream_t stream) {
  const int64_t count = product(map.y_shape, map.rank);
  if (count == 0) return;
  const int64_t x_count = product(map.x_shape, map.rank);
  if (x_count > 0) check_pointer(x, "x");  // an empty x padded with the constant reads none
  check_pointer(y, "y");
  if (leading_rows_moved(x, y, map, element_bytes, fill_bits, stream)) return;
  const AxisMap merged = merge_identity_axes(map);
  const bool narrow = count < (int64_t(1) << 31) && x_count < (int64_t(1) << 31);
  const bool last_axis_pad = narrow && merged.rank == 2 && static_cast<AxisMode>(merged.modes[0]) == AxisMode::Offset &&
                             merged.params[0] == 0 && merged.x_shape[0] == merged.y_shape[0] &&
                             static_cast<AxisMode>(merged.modes[1]) == AxisMode::Offset;
  GE2_DISPATCH_ELEMENT_SIZE(element_bytes, {
    const auto* source = static_cast<const storage_t*>(x);
    auto* target = static_cast<storage_t*>(y);
    const auto fill = static_cast<storage_t>(fill_bits);
    if (last_axis_pad) {
      last_axis_pad_kernel<storage_t><<<grid_blocks((count + kPadUnroll - 1) / kPadUnroll), kThreads, 0, stream>>>(
          source, target, FastDivmod(merged.y_shape[1]), static_cast<int32_t>(merged.x_shape[1]),
          static_cast<int32_t>(merged.params[1]), static_cast<uint32_t>(count), fill);
      GE2_CHECK_LAUNCH("indexing last_axis_pad_kernel");
      return;
    }
    if (narrow) {
      axis_map_kernel<storage_t, int32_t><<<grid_blocks(count), kThreads, 0, stream>>>(source, target, merged, count,
                                                                                      fill);
    } else {
      axis_map_kernel<storage_t, int64_t><<<grid_blocks(count), kThreads, 0, stream>>>(source, target, merged, count,
                                                                                      fill);
    }
    GE2_CHECK_LAUNCH("indexing axis_map_kernel");
  });
}

void gather(const void* x, const void* indices, void* y, const GatherGeometry& geometry, DType index_dtype,
            int element_bytes, uint64_t fill_bits, cudaStream_t stream) {
  const int64_t count = product(geometry.y_shape, geometry.rank);
  if (count == 0) return;
  check_pointer(x, "x");
  check_pointer(indices, "indices");
  check_pointer(y, "y");
  if (geometry.axis_extent == 0) throw std::invalid_argument("x: gathering from an empty axis");
  GE2_DISPATCH_ELEMENT_SIZE(element_bytes, GE2_DISPATCH_INDEX(index_dtype, {
    gather_kernel<storage_t, index_t><<<grid_blocks(count), kThreads, 0, stream>>>(
        static_cast<const storage_t*>(x), static_cast<const index_t*>(indices), static_cast<storage_t*>(y),
        geometry, count, static_cast<storage_t>(fill_bits));
    GE2_CHECK_LAUNCH("indexing gather_kernel");
  }));
}

void gather_nd(const void* x, const void* indices, void* y, const GatherNdGeometry& geometry, DType index_dtype,
               int element_bytes, uint64_t fill_bits, cudaStream_t stream) {
  const int64_t count = product(geometry.y_shape, geometry.rank);
  if (count == 0) return;
  check_pointer(x, "x");
  check_pointer(indices, "indices");
  check_pointer(y, "y");
  for (int component = 0; component < geometry.components; ++component) {
    if (geometry.extents[component] == 0) throw std::invalid_argument("x: gathering from an empty axis");
  }
  GE2_DISPATCH_ELEMENT_SIZE(element_bytes, GE2_DISPATCH_INDEX(index_dtype, {
    gather_nd_kernel<storage_t, index_t><<<grid_blocks(count), kThreads, 0, stream>>>(
        static_cast<const storage_t*>(x), static_cast<const index_t*>(indices), static_cast<storage_t*>(y),
        geometry, count, static_cast<storage_t>(fill_bits));
    GE2_CHECK_LAUNCH("indexing gather_nd_kernel");
  }));
}

void trilu(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
           int element_bytes, cudaStream_t stream) {
  const int64_t count = batch * rows * cols;
  if (count == 0) return;
  check_pointer(x, "x");
  check_pointer(y, "y");
  GE2_DISPATCH_ELEMENT_SIZE(element_bytes, {
    trilu_kernel<storage_t><<<grid_blocks(count), kThreads, 0, stream>>>(
        static_cast<const storage_t*>(x), static_cast<storage_t*>(y), rows, cols, k, upper, count);
    GE2_CHECK_LAUNCH("indexing trilu_kernel");
  });
}

}  // namespace ge2::indexing
