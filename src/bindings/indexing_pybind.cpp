// _ops_indexing: the native face of the shape and index ops (graph_executor_v2.ops.indexing computes and validates
// their geometry). Raw device addresses in, work enqueued on `stream`; shapes are checked here again so a bad call
// raises instead of reading out of bounds.
#include <string>
#include <vector>

#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

void check_rank(std::size_t rank, const char* argument) {
  if (rank > static_cast<std::size_t>(ge2::kMaxDims)) {
    throw std::invalid_argument(std::string(argument) + ": at most " + std::to_string(ge2::kMaxDims) +
                                " dimensions, got " + std::to_string(rank));
  }
}

void check_length(const std::vector<int64_t>& values, std::size_t rank, const char* argument) {
  if (values.size() != rank) {
    throw std::invalid_argument(std::string(argument) + ": expected " + std::to_string(rank) + " entries, got " +
                                std::to_string(values.size()));
  }
}

void check_non_negative(int64_t value, const char* argument) {
  if (value < 0) throw std::invalid_argument(std::string(argument) + ": expected >= 0, got " + std::to_string(value));
}

int element_bytes_of(int bytes) {
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) {
    throw std::invalid_argument("element_bytes: expected 1, 2, 4 or 8, got " + std::to_string(bytes));
  }
  return bytes;
}

ge2::indexing::AxisMap make_axis_map(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& y_shape,
                                     const std::vector<int>& modes, const std::vector<int64_t>& params) {
  check_rank(y_shape.size(), "y_shape");
  check_length(x_shape, y_shape.size(), "x_shape");
  check_length(params, y_shape.size(), "params");
  if (modes.size() != y_shape.size()) {
    throw std::invalid_argument("modes: expected " + std::to_string(y_shape.size()) + " entries, got " +
                                std::to_string(modes.size()));
  }
  ge2::indexing::AxisMap map;
  map.rank = static_cast<int>(y_shape.size());
  bool empty = false;
  for (int axis = 0; axis < map.rank; ++axis) {
    check_non_negative(y_shape[axis], "y_shape");
    check_non_negative(x_shape[axis], "x_shape");
    empty = empty || y_shape[axis] == 0;
    map.y_shape[axis] = y_shape[axis];
    map.x_shape[axis] = x_shape[axis];
    map.modes[axis] = modes[axis];
    map.params[axis] = params[axis];
  }
  for (int axis = 0; axis < map.rank && !empty; ++axis) {
    const auto mode = static_cast<ge2::indexing::AxisMode>(modes[axis]);
    const std::string where = " (axis " + std::to_string(axis) + ")";
    if (modes[axis] < 0 || modes[axis] > 5) throw std::invalid_argument("modes: unknown mode" + where);
    if (mode != ge2::indexing::AxisMode::Offset && x_shape[axis] == 0) {
      throw std::invalid_argument("x_shape: an empty axis can only be padded with a constant" + where);
    }
    if (mode == ge2::indexing::AxisMode::Divide &&
        (params[axis] < 1 || (y_shape[axis] - 1) / params[axis] >= x_shape[axis])) {
      throw std::invalid_argument("params: the repeat count does not fit x_shape" + where);
    }
  }
  return map;
}

}  // namespace

PYBIND11_MODULE(_ops_indexing, m) {
  m.doc() = "GE2 shape and index ops: axis_map (expand, pad, roll, repeat_interleave, tile), gather, gather_nd, "
            "cumsum, trilu, arange, resize, adaptive_avg_pool";

  m.def(
      "axis_map",
      [](std::uintptr_t x, std::uintptr_t y, const std::vector<int64_t>& x_shape, const std::vector<int64_t>& y_shape,
         const std::vector<int>& modes, const std::vector<int64_t>& params, int element_bytes, uint64_t fill_bits,
         std::uintptr_t stream) {
        const auto map = make_axis_map(x_shape, y_shape, modes, params);
        const int bytes = element_bytes_of(element_bytes);
        ge2::binding::ReleaseGil release;
        ge2::indexing::axis_map(as_pointer(x), as_pointer(y), map, bytes, fill_bits, as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("x_shape"), py::arg("y_shape"), py::arg("modes"), py::arg("params"),
      py::arg("element_bytes"), py::arg("fill_bits"), py::arg("stream"),
      "Enqueues y[o] = x[map(o)] (both contiguous), one index map per axis (modes: ge2::indexing::AxisMode).");

  m.def(
      "gather",
      [](std::uintptr_t x, std::uintptr_t indices, std::uintptr_t y, const std::vector<int64_t>& y_shape,
         const std::vector<int64_t>& x_strides, const std::vector<int64_t>& index_strides, int axis,
         int64_t axis_extent, const std::string& index_dtype, int element_bytes, uint64_t fill_bits,
         std::uintptr_t stream) {
        check_rank(y_shape.size(), "y_shape");
        check_length(x_strides, y_shape.size(), "x_strides");
        check_length(index_strides, y_shape.size(), "index_strides");
        if (axis < 0 || axis >= static_cast<int>(y_shape.size())) {
          throw std::invalid_argument("axis: expected 0 to " + std::to_string(y_shape.size() - 1) + ", got " +
                                      std::to_string(axis));
        }
        const auto type = ge2::dtype_from_name(index_dtype, "index_dtype");
        if (type != ge2::DType::Int32 && type != ge2::DType::Int64) {
          throw std::invalid_argument("index_dtype: expected int32 or int64, got " + index_dtype);
        }
        ge2::indexing::GatherGeometry geometry;
        geometry.rank = static_cast<int>(y_shape.size());
        geometry.axis = axis;
        geometry.axis_extent = axis_extent;
        for (int k = 0; k < geometry.rank; ++k) {
          check_non_negative(y_shape[k], "y_shape");
          geometry.y_shape[k] = y_shape[k];
          geometry.x_strides[k] = x_strides[k];
          geometry.index_strides[k] = index_strides[k];
        }
        const int bytes = element_bytes_of(element_bytes);
        ge2::binding::ReleaseGil release;
        ge2::indexing::gather(as_pointer(x), as_pointer(indices), as_pointer(y), geometry, type, bytes, fill_bits,
                              as_stream(stream));
      },
      py::arg("x"), py::arg("indices"), py::arg("y"), py::arg("y_shape"), py::arg("x_strides"),
      py::arg("index_strides"), py::arg("axis"), py::arg("axis_extent"), py::arg("index_dtype"),
      py::arg("element_bytes"), py::arg("fill_bits"), py::arg("stream"),
      "Enqueues y[o] = x[o with the axis replaced by indices[o]] (strides in elements; y contiguous).");

  m.def(
      "gather_nd",
      [](std::uintptr_t x, std::uintptr_t indices, std::uintptr_t y, const std::vector<int64_t>& y_shape,
         const std::vector<int64_t>& x_strides, const std::vector<int64_t>& index_strides,
         const std::vector<int64_t>& extents, const std::vector<int64_t>& component_strides,
         const std::string& index_dtype, int element_bytes, uint64_t fill_bits, std::uintptr_t stream) {
        check_rank(y_shape.size(), "y_shape");
        check_length(x_strides, y_shape.size(), "x_strides");
        check_length(index_strides, y_shape.size(), "index_strides");
        check_rank(extents.size(), "extents");
        check_length(component_strides, extents.size(), "component_strides");
        const auto type = ge2::dtype_from_name(index_dtype, "index_dtype");
        if (type != ge2::DType::Int32 && type != ge2::DType::Int64) {
          throw std::invalid_argument("index_dtype: expected int32 or int64, got " + index_dtype);
        }
        ge2::indexing::GatherNdGeometry geometry;
        geometry.rank = static_cast<int>(y_shape.size());
        geometry.components = static_cast<int>(extents.size());
        for (int k = 0; k < geometry.rank; ++k) {
          check_non_negative(y_shape[k], "y_shape");
          geometry.y_shape[k] = y_shape[k];
          geometry.x_strides[k] = x_strides[k];
          geometry.index_strides[k] = index_strides[k];
        }
        for (int k = 0; k < geometry.components; ++k) {
          check_non_negative(extents[k], "extents");
          geometry.extents[k] = extents[k];
          geometry.component_strides[k] = component_strides[k];
        }
        const int bytes = element_bytes_of(element_bytes);
        ge2::binding::ReleaseGil release;
        ge2::indexing::gather_nd(as_pointer(x), as_pointer(indices), as_pointer(y), geometry, type, bytes,
                                 fill_bits, as_stream(stream));
      },
      py::arg("x"), py::arg("indices"), py::arg("y"), py::arg("y_shape"), py::arg("x_strides"),
      py::arg("index_strides"), py::arg("extents"), py::arg("component_strides"), py::arg("index_dtype"),
      py::arg("element_bytes"), py::arg("fill_bits"), py::arg("stream"),
      "Enqueues y[o] = x at the index tuple of o (ONNX GatherND; strides in elements; y contiguous).");

  m.def(
      "cumsum",
      [](std::uintptr_t x, std::uintptr_t y, int64_t outer, int64_t extent, int64_t inner, bool exclusive,
         bool reverse, const std::string& dtype, std::uintptr_t stream) {
        check_non_negative(outer, "outer");
        check_non_negative(extent, "extent");
        check_non_negative(inner, "inner");
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::indexing::cumsum(as_pointer(x), as_pointer(y), outer, extent, inner, exclusive, reverse, type,
                              as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("outer"), py::arg("extent"), py::arg("inner"), py::arg("exclusive"),
      py::arg("reverse"), py::arg("dtype"), py::arg("stream"),
      "Enqueues the cumulative sum along the middle axis of [outer, extent, inner].");

  m.def(
      "trilu",
      [](std::uintptr_t x, std::uintptr_t y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
         int element_bytes, std::uintptr_t stream) {
        check_non_negative(batch, "batch");
        check_non_negative(rows, "rows");
        check_non_negative(cols, "cols");
        const int bytes = element_bytes_of(element_bytes);
        ge2::binding::ReleaseGil release;
        ge2::indexing::trilu(as_pointer(x), as_pointer(y), batch, rows, cols, k, upper, bytes, as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("batch"), py::arg("rows"), py::arg("cols"), py::arg("k"), py::arg("upper"),
      py::arg("element_bytes"), py::arg("stream"), "Enqueues the lower or upper triangle of [batch, rows, cols].");

  m.def(
      "arange",
      [](std::uintptr_t y, int64_t count, double start, double delta, const std::string& dtype,
         std::uintptr_t stream) {
        check_non_negative(count, "count");
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::indexing::arange(as_pointer(y), count, start, delta, type, as_stream(stream));
      },
      py::arg("y"), py::arg("count"), py::arg("start"), py::arg("delta"), py::arg("dtype"), py::arg("stream"),
      "Enqueues y[i] = start + i * delta for i < count.");

  m.def(
      "resize",
      [](std::uintptr_t x, std::uintptr_t y, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w,
         int64_t channels, double scale_h, double scale_w, int coordinates, bool linear, int rounding,
         const std::string& dtype, std::uintptr_t stream) {
        for (auto [value, name] : {std::pair{planes, "planes"}, {in_h, "in_h"}, {in_w, "in_w"}, {out_h, "out_h"},
                                   {out_w, "out_w"}, {channels, "channels"}}) {
          check_non_negative(value, name);
        }
        if (!(scale_h > 0.0) || !(scale_w > 0.0)) throw std::invalid_argument("scale: expected > 0");
        if (coordinates < 0 || coordinates > 3) throw std::invalid_argument("coordinates: expected 0 to 3");
        if (rounding < 0 || rounding > 3) throw std::invalid_argument("rounding: expected 0 to 3");
        ge2::indexing::ResizeGeometry geometry;
        geometry.planes = planes;
        geometry.in_h = in_h;
        geometry.in_w = in_w;
        geometry.out_h = out_h;
        geometry.out_w = out_w;
        geometry.channels = channels;
        geometry.scale_h = scale_h;
        geometry.scale_w = scale_w;
        geometry.coordinates = static_cast<ge2::indexing::Coordinates>(coordinates);
        geometry.linear = linear;
        geometry.rounding = static_cast<ge2::indexing::Rounding>(rounding);
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::indexing::resize(as_pointer(x), as_pointer(y), geometry, type, as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("planes"), py::arg("in_h"), py::arg("in_w"), py::arg("out_h"),
      py::arg("out_w"), py::arg("channels"), py::arg("scale_h"), py::arg("scale_w"), py::arg("coordinates"),
      py::arg("linear"), py::arg("rounding"), py::arg("dtype"), py::arg("stream"),
      "Enqueues the resampling of [planes, in_h, in_w, channels] to [planes, out_h, out_w, channels] (channels 1: "
      "the planar [planes, h, w]).");

  m.def(
      "adaptive_avg_pool",
      [](std::uintptr_t x, std::uintptr_t y, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w,
         const std::string& dtype, std::uintptr_t stream) {
        for (auto [value, name] : {std::pair{planes, "planes"}, {in_h, "in_h"}, {in_w, "in_w"}, {out_h, "out_h"},
                                   {out_w, "out_w"}}) {
          check_non_negative(value, name);
        }
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::indexing::adaptive_avg_pool(as_pointer(x), as_pointer(y), planes, in_h, in_w, out_h, out_w, type,
                                         as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("planes"), py::arg("in_h"), py::arg("in_w"), py::arg("out_h"),
      py::arg("out_w"), py::arg("dtype"), py::arg("stream"),
      "Enqueues the adaptive average pooling of [planes, in_h, in_w] to [planes, out_h, out_w].");

  m.def(
      "kernels", [] { return ge2::binding::kernel_list(ge2::indexing::kernel_table()); },
      "The kernels with their priorities and constraints.");
}
