// _ops_swiglu: the native face of the swiglu op. Raw device addresses (0 = absent) and sizes in, work enqueued on
// `stream`; argument checking for users happens in ge2_swiglu.swiglu first.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_swiglu, m) {
  m.doc() = "SwiGLU for GE2, built out of tree: y = silu(a) * b";

  m.def(
      "forward",
      [](std::uintptr_t a, std::uintptr_t b, std::uintptr_t y, int64_t count, const std::string& dtype,
         const std::string& kernel, std::uintptr_t stream) {
        ge2::swiglu::ForwardArgs args;
        args.a = as_pointer(a);
        args.b = as_pointer(b);
        args.y = as_pointer(y);
        args.count = count;
        args.dtype = ge2::dtype_from_name(dtype);
        const auto requested = ge2::swiglu::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return ge2::swiglu::kernel_name(ge2::swiglu::forward(args, requested, as_stream(stream)));
      },
      py::arg("a"), py::arg("b"), py::arg("y"), py::arg("count"), py::arg("dtype"), py::arg("kernel"),
      py::arg("stream"), "Enqueues y = silu(a) * b; returns the kernel that ran.");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t a, std::uintptr_t b, std::uintptr_t da, std::uintptr_t db, int64_t count,
         const std::string& dtype, const std::string& kernel, std::uintptr_t stream) {
        ge2::swiglu::BackwardArgs args;
        args.dy = as_pointer(dy);
        args.a = as_pointer(a);
        args.b = as_pointer(b);
        args.da = as_pointer(da);
        args.db = as_pointer(db);
        args.count = count;
        args.dtype = ge2::dtype_from_name(dtype);
        const auto requested = ge2::swiglu::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return ge2::swiglu::kernel_name(ge2::swiglu::backward(args, requested, as_stream(stream)));
      },
      py::arg("dy"), py::arg("a"), py::arg("b"), py::arg("da"), py::arg("db"), py::arg("count"), py::arg("dtype"),
      py::arg("kernel"), py::arg("stream"), "Enqueues da, db (0 = not asked for); returns the kernel that ran.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t count, const std::string& dtype, bool aligned) {
        return ge2::swiglu::unsupported_reason(ge2::swiglu::kernel_from_name(kernel), count,
                                               ge2::dtype_from_name(dtype), aligned);
      },
      py::arg("kernel"), py::arg("count"), py::arg("dtype"), py::arg("aligned"),
      "Empty string when the kernel can run the problem, else the reason it cannot (host only, no GPU needed).");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::swiglu::kernel_table()); });
}
