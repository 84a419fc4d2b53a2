// _ops_scaled_gemm: the native face of the scaled_gemm op (FP8 matmul on cuBLASLt). Raw device addresses (0 =
// absent) and sizes in, work enqueued on `stream`; graph_executor_v2.ops.scaled_gemm checks arguments for users first.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

// The problem (sizes, dtypes, epilogue) of a call; pointers stay null (aligned) until the caller sets them.
ge2::scaled_gemm::ForwardArgs problem_args(int64_t rows, int64_t cols, int64_t inner, const std::string& a_dtype,
                                           const std::string& b_dtype, const std::string& out_dtype,
                                           const std::string& bias_dtype, const std::string& act) {
  ge2::scaled_gemm::ForwardArgs args;
  args.m = rows;
  args.n = cols;
  args.k = inner;
  args.a_dtype = ge2::dtype_from_name(a_dtype, "a_dtype");
  args.b_dtype = ge2::dtype_from_name(b_dtype, "b_dtype");
  args.y_dtype = ge2::dtype_from_name(out_dtype, "out_dtype");
  if (!bias_dtype.empty()) args.bias_dtype = ge2::dtype_from_name(bias_dtype, "bias_dtype");
  args.act = ge2::act_from_name(act);
  return args;
}

}  // namespace

PYBIND11_MODULE(_ops_scaled_gemm, m) {
  m.doc() = "GE2 scaled_gemm: Y = act(scale_a * scale_b * A @ B^T + bias) in FP8 on cuBLASLt, with the output's amax";

  m.def(
      "forward",
      [](std::uintptr_t a, std::uintptr_t b, std::uintptr_t scale_a, std::uintptr_t scale_b, std::uintptr_t bias,
         std::uintptr_t scale_d, std::uintptr_t y, std::uintptr_t amax, int64_t rows, int64_t cols, int64_t inner,
         const std::string& a_dtype, const std::string& b_dtype, const std::string& out_dtype,
         const std::string& bias_dtype, const std::string& act, bool fast_accum, std::uintptr_t stream) {
        auto args = problem_args(rows, cols, inner, a_dtype, b_dtype, out_dtype, bias_dtype, act);
        args.a = as_pointer(a);
        args.b = as_pointer(b);
        args.scale_a = as_pointer<const float>(scale_a);
        args.scale_b = as_pointer<const float>(scale_b);
        args.bias = as_pointer(bias);
        args.scale_d = as_pointer<const float>(scale_d);
        args.y = as_pointer(y);
        args.amax = as_pointer<float>(amax);
        args.fast_accum = fast_accum;
        ge2::binding::ReleaseGil release;
        return ge2::scaled_gemm::forward(args, as_stream(stream));
      },
      py::arg("a"), py::arg("b"), py::arg("scale_a"), py::arg("scale_b"), py::arg("bias"), py::arg("scale_d"),
      py::arg("y"), py::arg("amax"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("a_dtype"),
      py::arg("b_dtype"), py::arg("out_dtype"), py::arg("bias_dtype"), py::arg("act"), py::arg("fast_accum"),
      py::arg("stream"),
      "Enqueues Y[m, n] = act(scale_a * scale_b * A[m, k] @ B[n, k]^T + bias) (times scale_d for an FP8 Y) and "
      "amax = max |act(...)|; returns how the amax was computed ('cublaslt' or 'cublaslt+amax_kernel').");

  m.def(
      "unsupported_reason",
      [](int64_t rows, int64_t cols, int64_t inner, const std::string& a_dtype, const std::string& b_dtype,
         const std::string& out_dtype, const std::string& bias_dtype, const std::string& act, int major, int minor) {
        // null pointers: a plan's buffers are 256-byte aligned
        const auto args = problem_args(rows, cols, inner, a_dtype, b_dtype, out_dtype, bias_dtype, act);
        return ge2::scaled_gemm::unsupported_reason(args, !bias_dtype.empty(), major, minor);
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("a_dtype"), py::arg("b_dtype"), py::arg("out_dtype"),
      py::arg("bias_dtype"), py::arg("act"), py::arg("major"), py::arg("minor"),
      "Empty when cuBLASLt's FP8 matmul can run the problem (aligned buffers, bias_dtype '' for none), else why not.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::scaled_gemm::kernel_table()); },
        "The candidates with their constraints, best first.");
  m.def("plan_count", &ge2::scaled_gemm::plan_count, "Number of cached cuBLASLt plans.");
}
