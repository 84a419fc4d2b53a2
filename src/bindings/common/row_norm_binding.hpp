// What _ops_layernorm and _ops_rmsnorm expose alike besides forward/backward: the kernel table, the kernels'
// limits and the backward's workspace size, for the shared row-norm kernels (backends/cuda/ops/_common/row_norm.hpp).
#pragma once
#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include "kernel_list.hpp"
#include "row_norm.hpp"

namespace ge2::binding {

template <bool kCentered>
void def_row_norm_queries(pybind11::module_& m) {
  namespace py = pybind11;
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
