// _ops_slice: the native face of slice. Raw device addresses and a normalized geometry in (starts inside x, steps
// and y's extents per axis: graph_executor_v2.ops.slice turns ONNX starts/ends/axes/steps into it), work enqueued
// on `stream`.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

void check_length(const std::vector<int64_t>& values, std::size_t rank, const char* argument) {
  if (values.size() != rank) {
    throw std::invalid_argument(std::string(argument) + ": expected " + std::to_string(rank) + " entries (one per "
                                "axis of x), got " + std::to_string(values.size()));
  }
}

ge2::slice::Geometry make_geometry(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& starts,
                                   const std::vector<int64_t>& steps, const std::vector<int64_t>& y_shape) {
  if (x_shape.size() > static_cast<std::size_t>(ge2::kMaxDims)) {
    throw std::invalid_argument("x_shape: at most " + std::to_string(ge2::kMaxDims) + " dimensions, got " +
                                std::to_string(x_shape.size()));
  }
  check_length(starts, x_shape.size(), "starts");
  check_length(steps, x_shape.size(), "steps");
  check_length(y_shape, x_shape.size(), "y_shape");
  ge2::slice::Geometry geometry;
  geometry.rank = static_cast<int>(x_shape.size());
  for (int k = 0; k < geometry.rank; ++k) {
    geometry.x_shape[k] = x_shape[k];
    geometry.starts[k] = starts[k];
    geometry.steps[k] = steps[k];
    geometry.y_shape[k] = y_shape[k];
  }
  return geometry;
}

}  // namespace

PYBIND11_MODULE(_ops_slice, m) {
  m.doc() = "GE2 slice: y = x[start::step per axis] (ONNX Slice, normalized) and its backward";

  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t y, const std::vector<int64_t>& x_shape,
         const std::vector<int64_t>& x_strides, const std::vector<int64_t>& starts, const std::vector<int64_t>& steps,
         const std::vector<int64_t>& y_shape, const std::string& dtype, std::uintptr_t stream) {
        const auto geometry = make_geometry(x_shape, starts, steps, y_shape);
        check_length(x_strides, x_shape.size(), "x_strides");
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::slice::forward(as_pointer(x), x_strides.data(), as_pointer(y), geometry, type, as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("x_shape"), py::arg("x_strides"), py::arg("starts"), py::arg("steps"),
      py::arg("y_shape"), py::arg("dtype"), py::arg("stream"),
      "Enqueues y = the slice of x (x strided, strides in elements; y contiguous of shape y_shape).");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t dx, const std::vector<int64_t>& dy_strides,
         const std::vector<int64_t>& x_shape, const std::vector<int64_t>& starts, const std::vector<int64_t>& steps,
         const std::vector<int64_t>& y_shape, const std::string& dtype, std::uintptr_t stream) {
        const auto geometry = make_geometry(x_shape, starts, steps, y_shape);
        check_length(dy_strides, x_shape.size(), "dy_strides");
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::slice::backward(as_pointer(dy), dy_strides.data(), as_pointer(dx), geometry, type, as_stream(stream));
      },
      py::arg("dy"), py::arg("dx"), py::arg("dy_strides"), py::arg("x_shape"), py::arg("starts"), py::arg("steps"),
      py::arg("y_shape"), py::arg("dtype"), py::arg("stream"),
      "Enqueues dx = zeros of x_shape with the slice set to dy (dy strided, strides in elements; dx contiguous).");

  m.def(
      "kernels", [] { return ge2::binding::kernel_list(ge2::slice::kernel_table()); },
      "The forward kernels with their priorities and constraints.");
}
