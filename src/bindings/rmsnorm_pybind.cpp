// _ops_rmsnorm: the native face of the rmsnorm op. Raw device addresses (0 = absent) and sizes in, work enqueued on
// `stream`; argument checking for users happens in graph_executor_v2.ops.rmsnorm before any of this runs.
#include "api.hpp"
#include "op_binding.hpp"
#include "row_norm_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_rmsnorm, m) {
  m.doc() = "GE2 rmsnorm over the last axis: y = x / sqrt(mean(x^2) + eps) * gamma";

  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t y, std::uintptr_t rstd, int64_t rows, int64_t cols,
         const std::string& dtype, float eps, const std::string& kernel, std::uintptr_t stream) {
        ge2::rmsnorm::ForwardArgs args;
        args.x = as_pointer(x);
        args.gamma = as_pointer(gamma);
        args.y = as_pointer(y);
        args.rstd = as_pointer<float>(rstd);
        args.rows = rows;
        args.cols = cols;
        args.dtype = ge2::dtype_from_name(dtype);
        args.eps = eps;
        const auto requested = ge2::row_norm::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::row_norm::kernel_name(ge2::rmsnorm::forward(args, requested, as_stream(stream))));
      },
      py::arg("x"), py::arg("gamma"), py::arg("y"), py::arg("rstd"), py::arg("rows"), py::arg("cols"),
      py::arg("dtype"), py::arg("eps"), py::arg("kernel"), py::arg("stream"),
      "Enqueues y (and the float32 rstd per row when its address is not 0); returns the kernel that ran.");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t rstd, std::uintptr_t dx,
         std::uintptr_t dgamma, std::uintptr_t workspace, std::size_t workspace_bytes, int64_t rows, int64_t cols,
         const std::string& dtype, float eps, const std::string& kernel, std::uintptr_t stream) {
        ge2::rmsnorm::BackwardArgs args;
        args.dy = as_pointer(dy);
        args.x = as_pointer(x);
        args.gamma = as_pointer(gamma);
        args.rstd = as_pointer<const float>(rstd);
        args.dx = as_pointer(dx);
        args.dgamma = as_pointer(dgamma);
        args.workspace = as_pointer<float>(workspace);
        args.workspace_bytes = workspace_bytes;
        args.rows = rows;
        args.cols = cols;
        args.dtype = ge2::dtype_from_name(dtype);
        args.eps = eps;
        const auto requested = ge2::row_norm::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::row_norm::kernel_name(ge2::rmsnorm::backward(args, requested, as_stream(stream))));
      },
      py::arg("dy"), py::arg("x"), py::arg("gamma"), py::arg("rstd"), py::arg("dx"), py::arg("dgamma"),
      py::arg("workspace"), py::arg("workspace_bytes"), py::arg("rows"), py::arg("cols"), py::arg("dtype"),
      py::arg("eps"), py::arg("kernel"), py::arg("stream"),
      "Enqueues dx and dgamma (rstd 0: recomputed from x); returns the kernel that ran.");

  ge2::binding::def_row_norm_queries</*kCentered=*/false>(m);
}
