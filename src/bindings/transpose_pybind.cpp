// _ops_transpose: the native face of transpose (and of reshape's device copy). Raw device addresses and sizes in,
// work enqueued on `stream`; users' arguments are checked in graph_executor_v2.ops.transpose before this runs.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

ge2::transpose::Problem make_problem(std::uintptr_t x, std::uintptr_t y, const std::vector<int64_t>& shape,
                                     const std::vector<int64_t>& strides, const std::vector<int>& perm,
                                     const std::string& dtype) {
  if (shape.size() > static_cast<std::size_t>(ge2::kMaxDims)) {
    throw std::invalid_argument("shape: at most " + std::to_string(ge2::kMaxDims) + " dimensions, got " +
                                std::to_string(shape.size()));
  }
  if (strides.size() != shape.size()) {
    throw std::invalid_argument("strides: expected " + std::to_string(shape.size()) + " entries, got " +
                                std::to_string(strides.size()));
  }
  if (perm.size() != shape.size()) {
    throw std::invalid_argument("perm: expected " + std::to_string(shape.size()) + " entries, got " +
                                std::to_string(perm.size()));
  }
  ge2::transpose::Problem problem;
  problem.x = as_pointer(x);
  problem.y = as_pointer(y);
  problem.dtype = ge2::dtype_from_name(dtype);
  problem.rank = static_cast<int>(shape.size());
  for (int k = 0; k < problem.rank; ++k) {
    problem.shape[k] = shape[k];
    problem.strides[k] = strides[k];
    problem.perm[k] = perm[k];
  }
  return problem;
}

}  // namespace

PYBIND11_MODULE(_ops_transpose, m) {
  m.doc() = "GE2 transpose: y = x.transpose(perm) into a contiguous y (any rank <= 8, any input strides)";

  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t y, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
         const std::vector<int>& perm, const std::string& dtype, const std::string& kernel, std::uintptr_t stream) {
        const auto problem = make_problem(x, y, shape, strides, perm, dtype);
        const auto requested = ge2::transpose::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::transpose::kernel_name(ge2::transpose::forward(problem, requested, as_stream(stream))));
      },
      py::arg("x"), py::arg("y"), py::arg("shape"), py::arg("strides"), py::arg("perm"), py::arg("dtype"),
      py::arg("kernel"), py::arg("stream"),
      "Enqueues y = x.transpose(perm) on `stream` (shape and strides are x's, strides in elements); returns the "
      "name of the kernel that ran.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
         const std::vector<int>& perm, const std::string& dtype, std::uintptr_t x, std::uintptr_t y) {
        return ge2::transpose::unsupported_reason(ge2::transpose::kernel_from_name(kernel),
                                                  make_problem(x, y, shape, strides, perm, dtype));
      },
      py::arg("kernel"), py::arg("shape"), py::arg("strides"), py::arg("perm"), py::arg("dtype"), py::arg("x"),
      py::arg("y"),
      "Empty string when the kernel can run the problem, else the reason it cannot. Only the alignment of the "
      "addresses x and y matters (the plan's buffers are 256-byte aligned).");

  m.def(
      "copy",
      [](std::uintptr_t src, std::uintptr_t dst, int64_t nbytes, std::uintptr_t stream) {
        ge2::binding::ReleaseGil release;
        ge2::transpose::copy(as_pointer(src), as_pointer(dst), nbytes, as_stream(stream));
      },
      py::arg("src"), py::arg("dst"), py::arg("nbytes"), py::arg("stream"),
      "Enqueues a device-to-device copy of nbytes (reshape when the executor cannot alias its output).");

  m.def(
      "kernels", [] { return ge2::binding::kernel_list(ge2::transpose::kernel_table()); },
      "The forward kernels with their priorities and constraints.");
}
