// _ops_layernorm: the native face of the layernorm op. Raw device addresses (0 = absent) and sizes in, work enqueued
// on `stream`; argument checking for users happens in graph_executor_v2.ops.layernorm before any of this runs.
#include "api.hpp"
#include "op_binding.hpp"
#include "row_norm_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_layernorm, m) {
  m.doc() = "GE2 layernorm over the last axis: y = (x - mean) / sqrt(var + eps) * gamma + beta";

  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t beta, std::uintptr_t y, std::uintptr_t mean,
         std::uintptr_t rstd, int64_t rows, int64_t cols, const std::string& dtype, float eps,
         const std::string& kernel, std::uintptr_t stream) {
        ge2::layernorm::ForwardArgs args;
        args.x = as_pointer(x);
        args.gamma = as_pointer(gamma);
        args.beta = as_pointer(beta);
        args.y = as_pointer(y);
        args.mean = as_pointer<float>(mean);
        args.rstd = as_pointer<float>(rstd);
        args.rows = rows;
        args.cols = cols;
        args.dtype = ge2::dtype_from_name(dtype);
        args.eps = eps;
        const auto requested = ge2::row_norm::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::row_norm::kernel_name(ge2::layernorm::forward(args, requested, as_stream(stream))));
      },
      py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("y"), py::arg("mean"), py::arg("rstd"),
      py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("eps"), py::arg("kernel"), py::arg("stream"),
      "Enqueues y (and the float32 mean/rstd per row when their addresses are not 0); returns the kernel that ran.");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t mean, std::uintptr_t rstd,
         std::uintptr_t dx, std::uintptr_t dgamma, std::uintptr_t dbeta, std::uintptr_t workspace,
         std::size_t workspace_bytes, int64_t rows, int64_t cols, const std::string& dtype, float eps,
         const std::string& kernel, std::uintptr_t stream) {
        ge2::layernorm::BackwardArgs args;
        args.dy = as_pointer(dy);
        args.x = as_pointer(x);
        args.gamma = as_pointer(gamma);
        args.mean = as_pointer<const float>(mean);
        args.rstd = as_pointer<const float>(rstd);
        args.dx = as_pointer(dx);
        args.dgamma = as_pointer(dgamma);
        args.dbeta = as_pointer(dbeta);
        args.workspace = as_pointer<float>(workspace);
        args.workspace_bytes = workspace_bytes;
        args.rows = rows;
        args.cols = cols;
        args.dtype = ge2::dtype_from_name(dtype);
        args.eps = eps;
        const auto requested = ge2::row_norm::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::row_norm::kernel_name(ge2::layernorm::backward(args, requested, as_stream(stream))));
      },
      py::arg("dy"), py::arg("x"), py::arg("gamma"), py::arg("mean"), py::arg("rstd"), py::arg("dx"),
      py::arg("dgamma"), py::arg("dbeta"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("rows"),
      py::arg("cols"), py::arg("dtype"), py::arg("eps"), py::arg("kernel"), py::arg("stream"),
      "Enqueues dx, dgamma, dbeta (mean/rstd 0: recomputed from x); returns the kernel that ran.");

  ge2::binding::def_row_norm_queries</*kCentered=*/true>(m);
}
