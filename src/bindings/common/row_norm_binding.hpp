// _ops_layernorm and _ops_rmsnorm: one binding for both modules of the row_norm op folder, for the variant being
// built (kOpCentered). Both take the same arguments; rmsnorm's beta, mean and dbeta are 0 (absent). Raw device
// addresses (0 = absent) and sizes in, work enqueued on `stream`; argument checking for users happens in
// graph_executor_v2.ops before any of this runs.
#pragma once
#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include "api.hpp"
#include "c_launch.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace ge2::binding {

inline void def_row_norm(pybind11::module_& m) {
  namespace py = pybind11;
  constexpr bool kCentered = row_norm::kOpCentered;
  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t beta, std::uintptr_t y, std::uintptr_t mean,
         std::uintptr_t rstd, int64_t rows, int64_t cols, const std::string& dtype, float eps,
         const std::string& kernel, std::uintptr_t stream) {
        row_norm::Forward args;
        args.x = as_pointer(x);
        args.gamma = as_pointer(gamma);
        args.beta = as_pointer(beta);
        args.y = as_pointer(y);
        args.mean = as_pointer<float>(mean);
        args.rstd = as_pointer<float>(rstd);
        args.rows = rows;
        args.cols = cols;
        args.dtype = dtype_from_name(dtype);
        args.eps = eps;
        const auto requested = row_norm::kernel_from_name(kernel);
        ReleaseGil release;
        return std::string(row_norm::kernel_name(row_norm::forward<kCentered>(args, requested, as_stream(stream))));
      },
      py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("y"), py::arg("mean"), py::arg("rstd"),
      py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("eps"), py::arg("kernel"), py::arg("stream"),
      "Enqueues y (and the float32 statistics per row whose addresses are not 0); returns the kernel that ran.");

  m.def(
      "bind_forward",
      [](int64_t rows, int64_t cols, const std::string& dtype, float eps, const std::string& kernel, bool has_beta) {
        struct Bound {
          row_norm::Forward args;
          row_norm::Kernel kernel;
          bool has_beta;
        };
        Bound bound;
        bound.args.rows = rows;
        bound.args.cols = cols;
        bound.args.dtype = dtype_from_name(dtype);
        bound.args.eps = eps;
        bound.kernel = row_norm::kernel_from_name(kernel);
        bound.has_beta = has_beta;
        const int inputs = has_beta ? 3 : 2;
        return make_c_launch<Bound>(
            bound, inputs, 1, [](Bound& b, const std::uintptr_t* in, const std::uintptr_t* out, cudaStream_t stream) {
              row_norm::Forward args = b.args;
              args.x = as_pointer(in[0]);
              args.gamma = as_pointer(in[1]);
              args.beta = b.has_beta ? as_pointer(in[2]) : nullptr;
              args.y = as_pointer(out[0]);
              row_norm::forward<kCentered>(args, b.kernel, stream);
            });
      },
      py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("eps"), py::arg("kernel"), py::arg("has_beta"),
      "forward for one problem as a C launch (inputs x, gamma (, beta); output y, no statistics), its arguments "
      "converted once.");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t mean, std::uintptr_t rstd,
         std::uintptr_t dx, std::uintptr_t dgamma, std::uintptr_t dbeta, std::uintptr_t workspace,
         std::size_t workspace_bytes, int64_t rows, int64_t cols, const std::string& dtype, float eps,
         const std::string& kernel, std::uintptr_t stream) {
        row_norm::Backward args;
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
        args.dtype = dtype_from_name(dtype);
        args.eps = eps;
        const auto requested = row_norm::kernel_from_name(kernel);
        ReleaseGil release;
        return std::string(
            row_norm::kernel_name(row_norm::backward<kCentered>(args, requested, as_stream(stream))));
      },
      py::arg("dy"), py::arg("x"), py::arg("gamma"), py::arg("mean"), py::arg("rstd"), py::arg("dx"),
      py::arg("dgamma"), py::arg("dbeta"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("rows"),
      py::arg("cols"), py::arg("dtype"), py::arg("eps"), py::arg("kernel"), py::arg("stream"),
      "Enqueues dx, dgamma (and dbeta; statistics 0: recomputed from x); returns the kernel that ran.");

  m.def(
      "backward_workspace_bytes",
      [](int64_t rows, int64_t cols, const std::string& dtype, const std::string& kernel, bool aligned) {
        return row_norm::backward_workspace_bytes<kCentered>(rows, cols, dtype_from_name(dtype), aligned,
                                                               row_norm::kernel_from_name(kernel));
      },
      py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("kernel"), py::arg("aligned"),
      "float32 workspace bytes the backward needs on the current device (aligned: dy, x, gamma, dx 16-byte aligned).");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t cols, const std::string& dtype, bool aligned, bool backward) {
        return row_norm::unsupported_reason(row_norm::kernel_from_name(kernel), cols, dtype_from_name(dtype),
                                            aligned, backward);
      },
      py::arg("kernel"), py::arg("cols"), py::arg("dtype"), py::arg("aligned"), py::arg("backward"),
      "Empty string when the kernel can run rows of `cols` elements (aligned: every pointer 16-byte aligned), else "
      "the reason it cannot.");

  m.def("kernels", [] { return kernel_list(row_norm::kernel_table()); });
}

}  // namespace ge2::binding
