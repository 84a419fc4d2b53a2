// _ops_gemm: the native face of the gemm op. Raw device addresses (0 = absent) and sizes in, work enqueued on
// `stream`; argument checking for users happens in graph_executor_v2.ops.gemm before any of this runs.
#include <cublasLt.h>

#include "api.hpp"
#include "c_launch.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

// The problem's fields, which ForwardArgs and BackwardArgs share.
template <typename Args>
Args problem_args(int64_t m, int64_t n, int64_t k, const std::string& dtype, bool trans_a, bool trans_b, float alpha,
                  float beta, const std::string& act, float slope, bool allow_tf32, bool residual_after_act) {
  Args args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.dtype = ge2::dtype_from_name(dtype);
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.alpha = alpha;
  args.beta = beta;
  args.act = ge2::act_from_name(act);
  args.slope = slope;
  args.allow_tf32 = allow_tf32;
  args.residual_after_act = residual_after_act;
  return args;
}

ge2::gemm::ForwardArgs forward_args(std::uintptr_t a, std::uintptr_t b, std::uintptr_t c, std::uintptr_t bias,
                                    std::uintptr_t y, std::uintptr_t preact, int64_t m, int64_t n, int64_t k,
                                    const std::string& dtype, bool trans_a, bool trans_b, float alpha, float beta,
                                    const std::string& act, float slope, bool allow_tf32, bool residual_after_act) {
  auto args = problem_args<ge2::gemm::ForwardArgs>(m, n, k, dtype, trans_a, trans_b, alpha, beta, act, slope,
                                                   allow_tf32, residual_after_act);
  args.a = as_pointer(a);
  args.b = as_pointer(b);
  args.c = as_pointer(c);
  args.bias = as_pointer(bias);
  args.y = as_pointer(y);
  args.preact = as_pointer(preact);
  return args;
}

ge2::gemm::BackwardArgs backward_args(std::uintptr_t dy, std::uintptr_t a, std::uintptr_t b, std::uintptr_t preact,
                                      std::uintptr_t dz_scratch, std::uintptr_t da, std::uintptr_t db,
                                      std::uintptr_t dbias, std::uintptr_t dc, int64_t m, int64_t n, int64_t k,
                                      const std::string& dtype, bool trans_a, bool trans_b, float alpha, float beta,
                                      const std::string& act, float slope, bool allow_tf32, std::uintptr_t a_preact,
                                      const std::string& a_act, float a_slope, std::uintptr_t dbias_a,
                                      bool residual_after_act) {
  auto args = problem_args<ge2::gemm::BackwardArgs>(m, n, k, dtype, trans_a, trans_b, alpha, beta, act, slope,
                                                    allow_tf32, residual_after_act);
  args.dy = as_pointer(dy);
  args.a = as_pointer(a);
  args.b = as_pointer(b);
  args.preact = as_pointer(preact);
  args.dz_scratch = as_pointer(dz_scratch);
  args.da = as_pointer(da);
  args.db = as_pointer(db);
  args.dbias = as_pointer(dbias);
  args.dc = as_pointer(dc);
  args.a_preact = as_pointer(a_preact);
  args.a_act = ge2::act_from_name(a_act, "a_act");
  args.a_slope = a_slope;
  args.dbias_a = as_pointer(dbias_a);
  return args;
}

}  // namespace

PYBIND11_MODULE(_ops_gemm, m) {
  m.doc() = "GE2 gemm: Y = act(alpha * op(A) @ op(B) + beta * C + bias), or act(alpha * op(A) @ op(B) + bias) + "
            "beta * C (residual_after_act) (row-major)";

  m.def(
      "forward",
      [](std::uintptr_t a, std::uintptr_t b, std::uintptr_t c, std::uintptr_t bias, std::uintptr_t y,
         std::uintptr_t preact, int64_t rows, int64_t cols, int64_t inner, const std::string& dtype, bool trans_a,
         bool trans_b, float alpha, float beta, const std::string& act, float slope, bool allow_tf32,
         const std::string& kernel, std::uintptr_t stream, bool residual_after_act) {
        const auto args = forward_args(a, b, c, bias, y, preact, rows, cols, inner, dtype, trans_a, trans_b, alpha,
                                       beta, act, slope, allow_tf32, residual_after_act);
        const auto requested = ge2::gemm::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::gemm::kernel_name(ge2::gemm::forward(args, requested, as_stream(stream))));
      },
      py::arg("a"), py::arg("b"), py::arg("c"), py::arg("bias"), py::arg("y"), py::arg("preact"), py::arg("m"),
      py::arg("n"), py::arg("k"), py::arg("dtype"), py::arg("trans_a"), py::arg("trans_b"), py::arg("alpha"),
      py::arg("beta"), py::arg("act"), py::arg("slope"), py::arg("allow_tf32"), py::arg("kernel"), py::arg("stream"),
      py::arg("residual_after_act") = false,
      "Enqueues the gemm on `stream`; returns the name of the kernel that ran.");

  m.def(
      "bind_forward",
      [](int64_t rows, int64_t cols, int64_t inner, const std::string& dtype, bool trans_a, bool trans_b, float alpha,
         float beta, const std::string& act, float slope, bool allow_tf32, const std::string& kernel,
         bool residual_after_act) {
        struct Bound {
          ge2::gemm::ForwardArgs args;
          ge2::gemm::Kernel kernel;
        };
        Bound bound{forward_args(0, 0, 0, 0, 0, 0, rows, cols, inner, dtype, trans_a, trans_b, alpha, beta, act,
                                 slope, allow_tf32, residual_after_act),
                    ge2::gemm::kernel_from_name(kernel)};
        return ge2::binding::make_c_launch<Bound>(
            bound, 4, 1, [](Bound& b, const std::uintptr_t* in, const std::uintptr_t* out, cudaStream_t stream) {
              ge2::gemm::ForwardArgs args = b.args;
              args.a = as_pointer(in[0]);
              args.b = as_pointer(in[1]);
              args.bias = as_pointer(in[2]);
              args.c = as_pointer(in[3]);
              args.y = as_pointer(out[0]);
              ge2::gemm::forward(args, b.kernel, stream);
            });
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::arg("trans_a"), py::arg("trans_b"),
      py::arg("alpha"), py::arg("beta"), py::arg("act"), py::arg("slope"), py::arg("allow_tf32"), py::arg("kernel"),
      py::arg("residual_after_act") = false,
      "forward for one problem as a C launch (inputs a, b, bias, c; output y), its arguments converted once.");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t a, std::uintptr_t b, std::uintptr_t preact, std::uintptr_t dz_scratch,
         std::uintptr_t da, std::uintptr_t db, std::uintptr_t dbias, std::uintptr_t dc, int64_t rows, int64_t cols,
         int64_t inner, const std::string& dtype, bool trans_a, bool trans_b, float alpha, float beta,
         const std::string& act, float slope, bool allow_tf32, std::uintptr_t a_preact, const std::string& a_act,
         float a_slope, std::uintptr_t dbias_a, const std::string& kernel, std::uintptr_t stream,
         bool residual_after_act) {
        const auto args = backward_args(dy, a, b, preact, dz_scratch, da, db, dbias, dc, rows, cols, inner, dtype,
                                        trans_a, trans_b, alpha, beta, act, slope, allow_tf32, a_preact, a_act,
                                        a_slope, dbias_a, residual_after_act);
        const auto requested = ge2::gemm::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        ge2::gemm::backward(args, requested, as_stream(stream));
      },
      py::arg("dy"), py::arg("a"), py::arg("b"), py::arg("preact"), py::arg("dz_scratch"), py::arg("da"),
      py::arg("db"), py::arg("dbias"), py::arg("dc"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"),
      py::arg("trans_a"), py::arg("trans_b"), py::arg("alpha"), py::arg("beta"), py::arg("act"), py::arg("slope"),
      py::arg("allow_tf32"), py::arg("a_preact"), py::arg("a_act"), py::arg("a_slope"), py::arg("dbias_a"),
      py::arg("kernel"), py::arg("stream"), py::arg("residual_after_act") = false,
      "Enqueues dA, dB, dbias, dC (each skipped when its address is 0) on `kernel` (cublaslt_epilogue, "
      "cublaslt_postkernel or tiled; ValueError naming the reason when it cannot run the call); with a_act, dA is "
      "the gradient w.r.t. a_preact and dbias_a the previous layer's bias gradient; dC is beta * dY with "
      "residual_after_act.");

  m.def(
      "backward_unsupported_reason",
      [](const std::string& kernel, std::uintptr_t dy, std::uintptr_t a, std::uintptr_t b, std::uintptr_t preact,
         std::uintptr_t dz_scratch, std::uintptr_t da, std::uintptr_t db, std::uintptr_t dbias, std::uintptr_t dc,
         int64_t rows, int64_t cols, int64_t inner, const std::string& dtype, bool trans_a, bool trans_b, float alpha,
         float beta, const std::string& act, float slope, bool allow_tf32, std::uintptr_t a_preact,
         const std::string& a_act, float a_slope, std::uintptr_t dbias_a, bool residual_after_act) {
        const auto args = backward_args(dy, a, b, preact, dz_scratch, da, db, dbias, dc, rows, cols, inner, dtype,
                                        trans_a, trans_b, alpha, beta, act, slope, allow_tf32, a_preact, a_act,
                                        a_slope, dbias_a, residual_after_act);
        return ge2::gemm::backward_unsupported_reason(ge2::gemm::kernel_from_name(kernel), args);
      },
      py::arg("kernel"), py::arg("dy"), py::arg("a"), py::arg("b"), py::arg("preact"), py::arg("dz_scratch"),
      py::arg("da"), py::arg("db"), py::arg("dbias"), py::arg("dc"), py::arg("m"), py::arg("n"), py::arg("k"),
      py::arg("dtype"), py::arg("trans_a"), py::arg("trans_b"), py::arg("alpha"), py::arg("beta"), py::arg("act"),
      py::arg("slope"), py::arg("allow_tf32"), py::arg("a_preact"), py::arg("a_act"), py::arg("a_slope"),
      py::arg("dbias_a"), py::arg("residual_after_act") = false,
      "Empty string when the backward kernel can run the call (these addresses: their alignment decides cuBLASLt's "
      "algorithms, and the cuBLASLt kernels ask its heuristic on the current device), else the reason it cannot.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t rows, int64_t cols, int64_t inner, const std::string& dtype,
         const std::string& act, bool has_bias, bool has_c, bool save_preact, bool pointers_aligned, bool trans_a,
         bool trans_b, bool residual_after_act) {
        ge2::gemm::ForwardArgs args;
        args.m = rows;
        args.n = cols;
        args.k = inner;
        args.dtype = ge2::dtype_from_name(dtype);
        args.act = ge2::act_from_name(act);
        args.trans_a = trans_a;
        args.trans_b = trans_b;
        args.residual_after_act = residual_after_act;
        // Only presence matters here; any non-null address stands in for a real one.
        args.bias = has_bias ? as_pointer(256) : nullptr;
        args.c = has_c ? as_pointer(256) : nullptr;
        args.preact = save_preact ? as_pointer(256) : nullptr;
        return ge2::gemm::unsupported_reason(ge2::gemm::kernel_from_name(kernel), args, pointers_aligned);
      },
      py::arg("kernel"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::arg("act"),
      py::arg("has_bias"), py::arg("has_c"), py::arg("save_preact"), py::arg("pointers_aligned"),
      py::arg("trans_a") = false, py::arg("trans_b") = false, py::arg("residual_after_act") = false,
      "Empty string when the kernel can run the problem, else the reason it cannot.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::gemm::kernel_table()); },
        "The candidates with their constraints, best first.");
  m.def("lt_plan_count", &ge2::gemm::lt_plan_count, "Number of cached cuBLASLt plans.");
  m.def("cublaslt_version", [] { return cublasLtGetVersion(); });
}
