// _ops_concat: the native face of concat. Every buffer contiguous; seen from the axis, each input is `outer` rows
// of widths[i] elements and y's rows are the inputs' rows side by side (graph_executor_v2.ops.concat computes that
// from shapes and an axis). Work enqueued on `stream`.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

ge2::concat::Layout make_layout(int64_t outer, const std::vector<int64_t>& widths, const std::string& dtype) {
  ge2::concat::Layout layout;
  layout.outer = outer;
  layout.widths = widths;
  layout.dtype = ge2::dtype_from_name(dtype);
  return layout;
}

}  // namespace

PYBIND11_MODULE(_ops_concat, m) {
  m.doc() = "GE2 concat: y = the inputs joined along an axis; backward splits dy into the inputs' gradients";

  m.def(
      "forward",
      [](const std::vector<std::uintptr_t>& inputs, std::uintptr_t y, int64_t outer, const std::vector<int64_t>& widths,
         const std::string& dtype, const std::string& kernel, std::uintptr_t stream) {
        const auto layout = make_layout(outer, widths, dtype);
        std::vector<const void*> pointers;
        for (std::uintptr_t input : inputs) pointers.push_back(as_pointer<const void>(input));
        const auto requested = ge2::concat::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::concat::kernel_name(
            ge2::concat::forward(pointers, as_pointer(y), layout, requested, as_stream(stream))));
      },
      py::arg("inputs"), py::arg("y"), py::arg("outer"), py::arg("widths"), py::arg("dtype"), py::arg("kernel"),
      py::arg("stream"), "Enqueues y = the inputs side by side; returns the name of the kernel that ran.");

  m.def(
      "backward",
      [](std::uintptr_t dy, const std::vector<std::uintptr_t>& grads, int64_t outer, const std::vector<int64_t>& widths,
         const std::string& dtype, const std::string& kernel, std::uintptr_t stream) {
        const auto layout = make_layout(outer, widths, dtype);
        std::vector<void*> pointers;
        for (std::uintptr_t grad : grads) pointers.push_back(as_pointer(grad));
        const auto requested = ge2::concat::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::concat::kernel_name(
            ge2::concat::backward(as_pointer<const void>(dy), pointers, layout, requested, as_stream(stream))));
      },
      py::arg("dy"), py::arg("grads"), py::arg("outer"), py::arg("widths"), py::arg("dtype"), py::arg("kernel"),
      py::arg("stream"), "Enqueues grads[i] = input i's columns of dy; returns the name of the kernel that ran.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t outer, const std::vector<int64_t>& widths, const std::string& dtype) {
        return ge2::concat::unsupported_reason(ge2::concat::kernel_from_name(kernel),
                                               make_layout(outer, widths, dtype));
      },
      py::arg("kernel"), py::arg("outer"), py::arg("widths"), py::arg("dtype"),
      "Empty string when the kernel can run the layout, else the reason it cannot.");

  m.def(
      "kernels", [] { return ge2::binding::kernel_list(ge2::concat::kernel_table()); },
      "The forward kernels with their priorities and constraints.");
}
