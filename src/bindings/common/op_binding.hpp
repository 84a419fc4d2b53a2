// Helpers every src/bindings/<op>_pybind.cpp uses. Op modules take raw device addresses (Python ints, 0 for
// "absent") plus sizes and a stream handle: the executor hands arena offsets straight through, and the Python
// layer (graph_executor_v2.ops.<op>) validates arguments and converts arrays before it gets here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dtype.hpp"
#include "tensor_view.hpp"

namespace ge2::binding {

namespace py = pybind11;

template <typename T = void>
inline T* as_pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

inline cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

// Contiguous row-major view unless strides (in elements) are given.
inline TensorView make_view(std::uintptr_t address, const std::vector<int64_t>& shape, const std::string& dtype,
                            const std::vector<int64_t>& strides = {}) {
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw std::invalid_argument("shape: at most " + std::to_string(kMaxDims) + " dimensions, got " +
                                std::to_string(shape.size()));
  }
  if (!strides.empty() && strides.size() != shape.size()) {
    throw std::invalid_argument("strides: expected " + std::to_string(shape.size()) + " entries, got " +
                                std::to_string(strides.size()));
  }
  TensorView view;
  view.data = as_pointer(address);
  view.dtype = dtype_from_name(dtype);
  view.ndim = static_cast<int>(shape.size());
  int64_t running = 1;
  for (int i = view.ndim - 1; i >= 0; --i) {
    view.shape[i] = shape[i];
    view.strides[i] = strides.empty() ? running : strides[i];
    running *= shape[i];
  }
  return view;
}

// Device work runs with the GIL released so other Python threads keep going.
using ReleaseGil = py::gil_scoped_release;

}  // namespace ge2::binding
