// _ops_reduce: the native face of sum, mean and max. Raw device addresses, the shape of x and the reduced axes
// (normalized: in [0, ndim), no repeats) in, work enqueued on `stream`; argument checking for users happens in
// graph_executor_v2.ops.reduce before any of this runs.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_reduce, m) {
  m.doc() = "GE2 reductions: sum, mean, max over a set of axes, float32 accumulation";

  m.def(
      "forward",
      [](const std::string& op, std::uintptr_t x, std::uintptr_t y, const std::vector<int64_t>& shape,
         const std::vector<int64_t>& axes, const std::string& dtype, const std::string& kernel,
         std::uintptr_t stream) {
        ge2::reduce::ForwardArgs args;
        args.x = as_pointer(x);
        args.y = as_pointer(y);
        args.reduction = ge2::reduce::reduction_from_name(op);
        args.layout = ge2::reduce::make_layout(shape, axes);
        args.dtype = ge2::dtype_from_name(dtype);
        const auto requested = ge2::reduce::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::reduce::kernel_name(ge2::reduce::forward(args, requested, as_stream(stream))));
      },
      py::arg("op"), py::arg("x"), py::arg("y"), py::arg("shape"), py::arg("axes"), py::arg("dtype"),
      py::arg("kernel"), py::arg("stream"),
      "Enqueues y = op(x) over `axes`; returns the name of the kernel that ran.");

  m.def(
      "backward",
      [](const std::string& op, std::uintptr_t dy, std::uintptr_t x, std::uintptr_t y, std::uintptr_t dx,
         const std::vector<int64_t>& shape, const std::vector<int64_t>& axes, const std::string& dtype,
         std::uintptr_t stream) {
        ge2::reduce::BackwardArgs args;
        args.dy = as_pointer(dy);
        args.x = as_pointer(x);
        args.y = as_pointer(y);
        args.dx = as_pointer(dx);
        args.reduction = ge2::reduce::reduction_from_name(op);
        args.layout = ge2::reduce::make_layout(shape, axes);
        args.dtype = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ge2::reduce::backward(args, as_stream(stream));
      },
      py::arg("op"), py::arg("dy"), py::arg("x"), py::arg("y"), py::arg("dx"), py::arg("shape"), py::arg("axes"),
      py::arg("dtype"), py::arg("stream"),
      "Enqueues dx (of x's shape) from dy; max also reads x and the forward output y (0 for sum and mean).");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, const std::vector<int64_t>& shape, const std::vector<int64_t>& axes) {
        return ge2::reduce::unsupported_reason(ge2::reduce::kernel_from_name(kernel),
                                               ge2::reduce::make_layout(shape, axes));
      },
      py::arg("kernel"), py::arg("shape"), py::arg("axes"),
      "Empty string when the kernel can run the problem, else the reason it cannot.");

  m.def(
      "layout",
      [](const std::vector<int64_t>& shape, const std::vector<int64_t>& axes) {
        const auto layout = ge2::reduce::make_layout(shape, axes);
        const char* kinds[] = {"rows", "columns", "generic"};
        py::dict info;
        info["kind"] = kinds[static_cast<int>(layout.kind)];
        info["outer"] = layout.outer;
        info["length"] = layout.length;
        info["inner"] = layout.inner;
        info["outputs"] = layout.outputs;
        info["count"] = layout.count;
        return info;
      },
      py::arg("shape"), py::arg("axes"),
      "How the native side sees the problem after dropping size-1 axes and merging neighbours.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::reduce::kernel_table()); },
        "The kernel variants: name, priority, description, constraints.");
}
