// slice: y = x[start_0 :: step_0, ..., start_{r-1} :: step_{r-1}] with y's extents given (ONNX Slice after its
// starts/ends/axes/steps are normalized in graph_executor_v2.ops.slice), and its backward: dx = 0 except
// dx[slice] = dy.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "tensor_view.hpp"
#include "kernel_info.hpp"

namespace ge2::slice {

// The slice per axis of x: y's extent `count`, x's first element `start` (0 <= start < x extent when count > 0) and
// `step` (nonzero, either sign). Every axis is described (an untouched axis: start 0, step 1, count = extent).
struct Geometry {
  int rank = 0;
  int64_t x_shape[kMaxDims] = {};
  int64_t starts[kMaxDims] = {};
  int64_t steps[kMaxDims] = {};
  int64_t y_shape[kMaxDims] = {};
};

// y (contiguous) = the slice of x (any strides, in elements).
void forward(const void* x, const int64_t* x_strides, void* y, const Geometry& geometry, DType dtype,
             cudaStream_t stream);

// dx (contiguous, x's shape) = zeros with the slice set to dy (any strides, in elements): one pass over dx.
void backward(const void* dy, const int64_t* dy_strides, void* dx, const Geometry& geometry, DType dtype,
              cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu and backward.cu ------------------------------------------------------------

// Throws std::invalid_argument for a geometry that would read or write out of bounds.
void check_geometry(const Geometry& geometry);

}  // namespace ge2::slice
