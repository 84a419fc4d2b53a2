// indexing: the shape and index ops models are made of, one module (_ops_indexing) for several GE2 ops.
//   axis_map  y[o] = x[f_0(o_0), ..., f_{r-1}(o_{r-1})], one index map per axis: expand (broadcast), pad
//             (constant, reflect, edge), roll, repeat_interleave, tile
//   gather    y[o] = x[o with axis replaced by indices[o]] (indices broadcast by strides): ONNX Gather,
//             index_select, take_along_axis / GatherElements
//   gather_nd y[o] = x[batch, indices[o][0], ..., indices[o][r-1], rest]: ONNX GatherND
//   cumsum    inclusive or exclusive, forward or reverse, along one axis
//   trilu     the lower or upper triangle (diagonal offset k) of the last two axes, zeros elsewhere
//   arange    y[i] = start + i * delta
//   resize    nearest / linear resampling of the last two axes (or the two before a channels axis) with ONNX's
//             coordinate transformations
//   adaptive_avg_pool  the mean over PyTorch's adaptive windows of the last two axes
// Data-movement kernels (axis_map, gather, trilu) work on element sizes (1, 2, 4, 8 bytes), so every dtype takes
// them; the arithmetic ones dispatch on the dtype.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"
#include "tensor_view.hpp"

namespace ge2::indexing {

// How an output index o along one axis picks the input index (n: the input extent, p: the axis parameter).
enum class AxisMode : int {
  Offset = 0,   // o - p; outside [0, n): the fill value (constant padding; p = 0 and n = extent: identity)
  Reflect = 1,  // o - p reflected into [0, n) without repeating the edge (reflect padding)
  Edge = 2,     // o - p clamped into [0, n) (edge padding)
  Wrap = 3,     // (o - p) mod n (roll by p)
  Divide = 4,   // o / p (repeat_interleave by p)
  Modulo = 5,   // o mod n (tile); broadcasting an extent-1 axis is Modulo with n = 1
};

struct AxisMap {
  int rank = 0;
  int64_t y_shape[kMaxDims] = {};
  int64_t x_shape[kMaxDims] = {};
  int modes[kMaxDims] = {};
  int64_t params[kMaxDims] = {};
};

// y (contiguous, map.y_shape) from x (contiguous, map.x_shape); fill_bits: the padding value's bytes.
void axis_map(const void* x, void* y, const AxisMap& map, int element_bytes, uint64_t fill_bits, cudaStream_t stream);

struct GatherGeometry {
  int rank = 0;
  int axis = 0;
  int64_t y_shape[kMaxDims] = {};
  int64_t x_strides[kMaxDims] = {};      // in elements; the axis' stride scales the index
  int64_t index_strides[kMaxDims] = {};  // in elements; 0 broadcasts the indices along that axis
  int64_t axis_extent = 0;               // x's extent along axis: indices in [-extent, extent)
};

// y (contiguous) = x gathered along axis; an index outside [-extent, extent) gives fill_bits (NaN for floats).
void gather(const void* x, const void* indices, void* y, const GatherGeometry& geometry, DType index_dtype,
            int element_bytes, uint64_t fill_bits, cudaStream_t stream);

struct GatherNdGeometry {
  int rank = 0;                          // y's rank: batch axes, index axes, the rest of x's axes
  int components = 0;                    // r: how many leading non-batch axes of x one index tuple addresses
  int64_t y_shape[kMaxDims] = {};
  int64_t x_strides[kMaxDims] = {};      // per y axis, in elements; 0 on the index axes
  int64_t index_strides[kMaxDims] = {};  // per y axis, in elements (of the tuples' first component); 0 on the rest
  int64_t extents[kMaxDims] = {};        // x's extent along each addressed axis: components in [-extent, extent)
  int64_t component_strides[kMaxDims] = {};  // x's stride along each addressed axis
};

// y (contiguous) = x at the index tuples (contiguous along their last axis); a component out of range gives
// fill_bits (NaN for floats).
void gather_nd(const void* x, const void* indices, void* y, const GatherNdGeometry& geometry, DType index_dtype,
               int element_bytes, uint64_t fill_bits, cudaStream_t stream);

// Along the middle axis of [outer, extent, inner] (contiguous).
void cumsum(const void* x, void* y, int64_t outer, int64_t extent, int64_t inner, bool exclusive, bool reverse,
            DType dtype, cudaStream_t stream);

// [batch, rows, cols] (contiguous): keeps j - i >= k (upper) or j - i <= k (lower), zero bits elsewhere.
void trilu(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
           int element_bytes, cudaStream_t stream);

// y[i] = start + i * delta for i < count (floats computed in double, then rounded once; integers exactly).
void arange(void* y, int64_t count, double start, double delta, DType dtype, cudaStream_t stream);

// ONNX Resize's coordinate transformations (x_original from x_resized, scale = resized / original).
enum class Coordinates : int { HalfPixel = 0, AlignCorners = 1, Asymmetric = 2, PytorchHalfPixel = 3 };
// ONNX's nearest_mode (how x_original rounds to an index).
enum class Rounding : int { RoundPreferFloor = 0, RoundPreferCeil = 1, Floor = 2, Ceil = 3 };

struct ResizeGeometry {
  int64_t planes = 0;  // product of the leading axes
  int64_t in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t channels = 1;  // the innermost axis, after the resized two (channels-last); 1: they are the last two
  double scale_h = 1.0, scale_w = 1.0;
  Coordinates coordinates = Coordinates::HalfPixel;
  bool linear = false;  // bilinear; else nearest
  Rounding rounding = Rounding::RoundPreferFloor;
};

void resize(const void* x, void* y, const ResizeGeometry& geometry, DType dtype, cudaStream_t stream);

// [planes, in_h, in_w] -> [planes, out_h, out_w]: output (i, j) averages rows [floor(i in_h / out_h),
// ceil((i + 1) in_h / out_h)) and the same for columns.
void adaptive_avg_pool(const void* x, void* y, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h,
                       int64_t out_w, DType dtype, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu and kernels/*.cu -----------------------------------------------------------
constexpr int kThreads = 256;

// Blocks of kThreads for a grid-stride loop over `count` elements: enough to fill the GPU, no more.
int grid_blocks(int64_t count);

// Throws std::invalid_argument naming `argument` for a null device pointer.
void check_pointer(const void* pointer, const char* argument);

}  // namespace ge2::indexing
