// slice launcher: geometry checks and the forward gather. The slice of x is itself a strided view of x (strides
// scaled by the steps, origin at the starts), so y = slice(x) is the shared strided copy into a contiguous y:
// extent-1 and mergeable axes fold away, a slice along the outermost axis with step 1 becomes one cudaMemcpyAsync,
// slices that keep the innermost axis whole move 16-byte vectors, and the rest (a step on the innermost axis,
// negative steps there) move element by element, still coalesced on the write side.
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "strided_copy_kernel.hpp"

namespace ge2::slice {

std::vector<KernelInfo> kernel_table() {
  return {
      {"strided", 10,
       "strided gather of the slice into y: cudaMemcpyAsync when the slice is one contiguous block, 16-byte "
       "vectors when whole innermost rows are kept, element by element otherwise",
       "none (the path that always works)", kFallback, kAnyAlignment},
  };
}

void check_geometry(const Geometry& geometry) {
  if (geometry.rank < 0 || geometry.rank > kMaxDims) {
    throw std::invalid_argument("x: expected rank 0 to " + std::to_string(kMaxDims) + ", got " +
                                std::to_string(geometry.rank));
  }
  bool empty = false;
  for (int k = 0; k < geometry.rank; ++k) {
    if (geometry.x_shape[k] < 0 || geometry.y_shape[k] < 0) throw std::invalid_argument("shape: extents must be >= 0");
    if (geometry.steps[k] == 0) throw std::invalid_argument("steps: axis " + std::to_string(k) + " has step 0");
    empty = empty || geometry.y_shape[k] == 0;
  }
  if (empty) return;
  for (int k = 0; k < geometry.rank; ++k) {
    const int64_t extent = geometry.x_shape[k], start = geometry.starts[k], step = geometry.steps[k];
    const int64_t count = geometry.y_shape[k];
    const bool inside = start >= 0 && start < extent &&
                        (count == 1 || ((step > 0 ? step : -step) < extent &&
                                        start + (count - 1) * step >= 0 && start + (count - 1) * step < extent));
    if (!inside) {
      throw std::invalid_argument("starts, steps: axis " + std::to_string(k) + " slice (start " +
                                  std::to_string(start) + ", step " + std::to_string(step) + ", count " +
                                  std::to_string(count) + ") leaves x's extent " + std::to_string(extent));
    }
  }
}

void forward(const void* x, const int64_t* x_strides, void* y, const Geometry& geometry, DType dtype,
             cudaStream_t stream) {
  check_geometry(geometry);
  StridedCopy copy;
  int64_t origin = 0;  // x's offset of the slice's first element, in elements
  int64_t y_stride = 1;
  for (int k = geometry.rank - 1; k >= 0; --k) {
    if (geometry.y_shape[k] == 0) return;
    origin += geometry.starts[k] * x_strides[k];
    // A count-1 axis is dropped when the copy is simplified, so its step (possibly huge) never scales a stride.
    copy.shape[k] = geometry.y_shape[k];
    copy.src_strides[k] = geometry.y_shape[k] > 1 ? geometry.steps[k] * x_strides[k] : 0;
    copy.dst_strides[k] = y_stride;
    y_stride *= geometry.y_shape[k];
  }
  copy.rank = geometry.rank;
  if (x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (y == nullptr) throw std::invalid_argument("y: null device pointer");
  const int element_bytes = static_cast<int>(dtype_size(dtype));
  launch_strided_copy(static_cast<const char*>(x) + origin * element_bytes, y, copy, element_bytes, stream);
}

}  // namespace ge2::slice
