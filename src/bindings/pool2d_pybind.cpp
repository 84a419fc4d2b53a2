// _ops_pool2d: the native face of max_pool2d, avg_pool2d and global_avg_pool. Raw device addresses (0 = absent),
// sizes and a stream handle in, work enqueued; argument checking for users happens in
// graph_executor_v2.ops.pool2d before any of this runs.
#include <array>

#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

// sizes = (batch, channels, height, width, out_height, out_width);
// window = (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w)
ge2::pool2d::Window make_window(const std::array<int64_t, 6>& sizes, const std::array<int, 8>& window,
                                bool count_include_pad, const std::string& layout) {
  ge2::pool2d::Window w;
  w.batch = sizes[0];
  w.channels = sizes[1];
  w.height = sizes[2];
  w.width = sizes[3];
  w.out_height = sizes[4];
  w.out_width = sizes[5];
  w.kernel_h = window[0];
  w.kernel_w = window[1];
  w.stride_h = window[2];
  w.stride_w = window[3];
  w.pad_h = window[4];
  w.pad_w = window[5];
  w.dilation_h = window[6];
  w.dilation_w = window[7];
  w.count_include_pad = count_include_pad;
  w.layout = ge2::pool2d::layout_from_name(layout);
  return w;
}

}  // namespace

PYBIND11_MODULE(_ops_pool2d, m) {
  m.doc() = "GE2 2-D pooling: max_pool2d, avg_pool2d, global_avg_pool (NCHW or NHWC)";

  m.def(
      "forward",
      [](const std::string& mode, std::uintptr_t x, std::uintptr_t y, std::uintptr_t indices,
         const std::array<int64_t, 6>& sizes, const std::array<int, 8>& window, bool count_include_pad,
         const std::string& layout, const std::string& dtype, std::uintptr_t stream) {
        ge2::pool2d::ForwardArgs args;
        args.mode = ge2::pool2d::mode_from_name(mode);
        args.x = as_pointer(x);
        args.y = as_pointer(y);
        args.indices = as_pointer<int32_t>(indices);
        args.window = make_window(sizes, window, count_include_pad, layout);
        args.dtype = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::pool2d::forward(args, as_stream(stream));
      },
      py::arg("mode"), py::arg("x"), py::arg("y"), py::arg("indices"), py::arg("sizes"), py::arg("window"),
      py::arg("count_include_pad"), py::arg("layout"), py::arg("dtype"), py::arg("stream"),
      "Enqueues y (and, for mode 'max', the int32 argmax indices). sizes = (batch, channels, height, width, "
      "out_height, out_width); window = (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, "
      "dilation_w).");

  m.def(
      "backward",
      [](const std::string& mode, std::uintptr_t dy, std::uintptr_t indices, std::uintptr_t dx,
         const std::array<int64_t, 6>& sizes, const std::array<int, 8>& window, bool count_include_pad,
         const std::string& layout, const std::string& dtype, std::uintptr_t stream) {
        ge2::pool2d::BackwardArgs args;
        args.mode = ge2::pool2d::mode_from_name(mode);
        args.dy = as_pointer(dy);
        args.indices = as_pointer<const int32_t>(indices);
        args.dx = as_pointer(dx);
        args.window = make_window(sizes, window, count_include_pad, layout);
        args.dtype = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::pool2d::backward(args, as_stream(stream));
      },
      py::arg("mode"), py::arg("dy"), py::arg("indices"), py::arg("dx"), py::arg("sizes"), py::arg("window"),
      py::arg("count_include_pad"), py::arg("layout"), py::arg("dtype"), py::arg("stream"),
      "Enqueues dx (every element written) from dy (and, for mode 'max', the forward's indices).");

  m.def(
      "global_forward",
      [](std::uintptr_t x, std::uintptr_t y, int64_t batch, int64_t channels, int64_t spatial,
         const std::string& layout, const std::string& dtype, std::uintptr_t stream) {
        ge2::pool2d::GlobalArgs args{as_pointer(x), as_pointer(y), batch, channels, spatial,
                                     ge2::pool2d::layout_from_name(layout), ge2::dtype_from_name(dtype)};
        ge2::binding::ReleaseGil release;
        ge2::pool2d::global_forward(args, as_stream(stream));
      },
      py::arg("x"), py::arg("y"), py::arg("batch"), py::arg("channels"), py::arg("spatial"), py::arg("layout"),
      py::arg("dtype"), py::arg("stream"), "Enqueues y[n, c] = mean of x[n, c] over its spatial elements.");

  m.def(
      "global_backward",
      [](std::uintptr_t dy, std::uintptr_t dx, int64_t batch, int64_t channels, int64_t spatial,
         const std::string& layout, const std::string& dtype, std::uintptr_t stream) {
        ge2::pool2d::GlobalArgs args{as_pointer(dy), as_pointer(dx), batch, channels, spatial,
                                     ge2::pool2d::layout_from_name(layout), ge2::dtype_from_name(dtype)};
        ge2::binding::ReleaseGil release;
        ge2::pool2d::global_backward(args, as_stream(stream));
      },
      py::arg("dy"), py::arg("dx"), py::arg("batch"), py::arg("channels"), py::arg("spatial"), py::arg("layout"),
      py::arg("dtype"), py::arg("stream"), "Enqueues dx = dy / spatial broadcast over the spatial elements.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::pool2d::kernel_table()); },
        "The kernels: name, priority, description, constraints.");
}
