// indexing launcher: the kernel table and what every kernel shares (grid size, pointer checks). The geometry each
// op needs (shapes, index maps, coordinate transformations) is computed and validated in
// graph_executor_v2.ops.indexing, and checked again by the binding before a launch.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::indexing {

std::vector<KernelInfo> kernel_table() {
  return {
      {"axis_map", 10, "y[o] = x[map(o)] per axis (offset/reflect/edge/wrap/divide/modulo): expand, pad, roll, "
                       "repeat_interleave, tile; one thread per output element (a constant pad or crop of the "
                       "leading axis alone, with a fill of like bytes: one contiguous copy and memsets)",
       "contiguous x and y; any dtype (1, 2, 4 or 8-byte elements)", kFallback, kAnyAlignment},
      {"gather", 10, "y[o] = x[o with the axis replaced by indices[o]], indices broadcast by strides: ONNX Gather, "
                     "index_select, take_along_axis",
       "int32 or int64 indices; any data dtype; an index out of range gives NaN (floats) or 0",
       kFallback, kAnyAlignment},
      {"gather_nd", 10, "y[o] = x[batch, indices[o] (one tuple of r components), rest]: ONNX GatherND; one thread per "
                        "output element",
       "int32 or int64 indices; any data dtype; a component out of range gives NaN (floats) or 0",
       kFallback, kAnyAlignment},
      {"cumsum", 10, "one thread per line along the axis, float32 or int64 accumulation", "float and int dtypes",
       kFallback, kAnyAlignment},
      {"trilu", 10, "the lower or upper triangle of the last two axes", "any dtype", kFallback, kAnyAlignment},
      {"arange", 10, "y[i] = start + i * delta", "float and int dtypes", kFallback, kAnyAlignment},
      {"resize", 10, "nearest or bilinear resampling of the last two axes, ONNX coordinate transformations",
       "float dtypes", kFallback, kAnyAlignment},
      {"adaptive_avg_pool", 10, "the mean over PyTorch's adaptive windows of the last two axes", "float dtypes",
       kFallback, kAnyAlignment},
  };
}

int grid_blocks(int64_t count) {
  int device = 0, sms = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((count + kThreads - 1) / kThreads,
                                                                 static_cast<int64_t>(sms) * 32)));
}

void check_pointer(const void* pointer, const char* argument) {
  if (pointer == nullptr) throw std::invalid_argument(std::string(argument) + ": null device pointer");
}

}  // namespace ge2::indexing
