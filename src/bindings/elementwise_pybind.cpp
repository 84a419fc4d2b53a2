// _ops_elementwise: the native face of the elementwise ops. Raw device addresses (0 = absent) and shapes in, work
// enqueued on `stream`; argument checking for users happens in graph_executor_v2.ops.elementwise first.
#include "api.hpp"
#include "c_launch.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;
namespace ew = ge2::elementwise;

PYBIND11_MODULE(_ops_elementwise, m) {
  m.doc() = "GE2 elementwise: add sub mul div (NumPy broadcasting), relu gelu gelu_erf silu sigmoid tanh exp neg";

  m.def(
      "binary",
      [](const std::string& op, std::uintptr_t a, std::uintptr_t b, std::uintptr_t y,
         const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape, const std::string& dtype,
         const std::string& kernel, std::uintptr_t stream) {
        const auto binary_op = ew::binary_op_from_name(op);
        const auto problem = ew::make_broadcast(a_shape, b_shape);
        const auto type = ge2::dtype_from_name(dtype);
        const auto requested = ew::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ew::kernel_name(
            ew::binary(binary_op, as_pointer(a), as_pointer(b), as_pointer(y), problem, type, requested,
                       as_stream(stream))));
      },
      py::arg("op"), py::arg("a"), py::arg("b"), py::arg("y"), py::arg("a_shape"), py::arg("b_shape"),
      py::arg("dtype"), py::arg("kernel"), py::arg("stream"),
      "Enqueues y = a (op) b with NumPy broadcasting (y contiguous, of the broadcast shape); returns the kernel "
      "that ran.");

  m.def(
      "unary",
      [](const std::string& op, std::uintptr_t x, std::uintptr_t y, int64_t numel, const std::string& dtype,
         const std::string& kernel, std::uintptr_t stream) {
        const auto unary_op = ew::unary_op_from_name(op);
        const auto type = ge2::dtype_from_name(dtype);
        const auto requested = ew::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ew::kernel_name(
            ew::unary(unary_op, as_pointer(x), as_pointer(y), numel, type, requested, as_stream(stream))));
      },
      py::arg("op"), py::arg("x"), py::arg("y"), py::arg("numel"), py::arg("dtype"), py::arg("kernel"),
      py::arg("stream"), "Enqueues y = op(x); returns the kernel that ran.");

  m.def(
      "bind_binary",
      [](const std::string& op, const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape,
         const std::string& dtype, const std::string& kernel) {
        struct Bound {
          ew::BinaryOp op;
          ew::Broadcast problem;
          ge2::DType dtype;
          ew::Kernel kernel;
        };
        const Bound bound{ew::binary_op_from_name(op), ew::make_broadcast(a_shape, b_shape),
                          ge2::dtype_from_name(dtype), ew::kernel_from_name(kernel)};
        return ge2::binding::make_c_launch<Bound>(
            bound, 2, 1, [](Bound& b, const std::uintptr_t* in, const std::uintptr_t* out, cudaStream_t stream) {
              ew::binary(b.op, as_pointer(in[0]), as_pointer(in[1]), as_pointer(out[0]), b.problem, b.dtype, b.kernel,
                         stream);
            });
      },
      py::arg("op"), py::arg("a_shape"), py::arg("b_shape"), py::arg("dtype"), py::arg("kernel"),
      "binary for one problem as a C launch (inputs a, b; output y), its arguments converted once.");

  m.def(
      "bind_unary",
      [](const std::string& op, int64_t numel, const std::string& dtype, const std::string& kernel) {
        struct Bound {
          ew::UnaryOp op;
          int64_t numel;
          ge2::DType dtype;
          ew::Kernel kernel;
        };
        const Bound bound{ew::unary_op_from_name(op), numel, ge2::dtype_from_name(dtype),
                          ew::kernel_from_name(kernel)};
        return ge2::binding::make_c_launch<Bound>(
            bound, 1, 1, [](Bound& b, const std::uintptr_t* in, const std::uintptr_t* out, cudaStream_t stream) {
              ew::unary(b.op, as_pointer(in[0]), as_pointer(out[0]), b.numel, b.dtype, b.kernel, stream);
            });
      },
      py::arg("op"), py::arg("numel"), py::arg("dtype"), py::arg("kernel"),
      "unary for one problem as a C launch (input x, output y), its arguments converted once.");

  m.def(
      "unary_backward",
      [](const std::string& op, std::uintptr_t dy, std::uintptr_t x, std::uintptr_t dx, int64_t numel,
         const std::string& dtype, std::uintptr_t stream) {
        const auto unary_op = ew::unary_op_from_name(op);
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ew::unary_backward(unary_op, as_pointer(dy), as_pointer(x), as_pointer(dx), numel, type, as_stream(stream));
      },
      py::arg("op"), py::arg("dy"), py::arg("x"), py::arg("dx"), py::arg("numel"), py::arg("dtype"),
      py::arg("stream"), "Enqueues dx = dy * op'(x).");

  m.def(
      "binary_backward",
      [](const std::string& op, std::uintptr_t dy, std::uintptr_t a, std::uintptr_t b, std::uintptr_t da,
         std::uintptr_t db, const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape,
         const std::string& dtype, std::uintptr_t stream) {
        const auto binary_op = ew::binary_op_from_name(op);
        const auto problem = ew::make_broadcast(a_shape, b_shape);
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ew::binary_backward(binary_op, as_pointer(dy), as_pointer(a), as_pointer(b), as_pointer(da), as_pointer(db),
                            problem, type, as_stream(stream));
      },
      py::arg("op"), py::arg("dy"), py::arg("a"), py::arg("b"), py::arg("da"), py::arg("db"), py::arg("a_shape"),
      py::arg("b_shape"), py::arg("dtype"), py::arg("stream"),
      "Enqueues da and db (each skipped when its address is 0), summed over the dims each operand was broadcast "
      "along.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, const std::string& op, const std::vector<int64_t>& a_shape,
         const std::vector<int64_t>& b_shape, const std::string& dtype) {
        ew::binary_op_from_name(op);
        return ew::unsupported_reason(ew::kernel_from_name(kernel), ew::make_broadcast(a_shape, b_shape),
                                      ge2::dtype_from_name(dtype));
      },
      py::arg("kernel"), py::arg("op"), py::arg("a_shape"), py::arg("b_shape"), py::arg("dtype"),
      "Binary ops: empty string when the kernel can run the problem (16-byte aligned buffers), else the reason.");
  m.def(
      "unsupported_reason",
      [](const std::string& kernel, const std::string& op, const std::vector<int64_t>& x_shape,
         const std::string& dtype) {
        ew::unary_op_from_name(op);
        int64_t numel = 1;
        for (const int64_t extent : x_shape) numel *= extent;
        return ew::unsupported_reason(ew::kernel_from_name(kernel), numel, ge2::dtype_from_name(dtype));
      },
      py::arg("kernel"), py::arg("op"), py::arg("x_shape"), py::arg("dtype"),
      "Unary ops: empty string when the kernel can run the problem, else the reason.");

  m.def("broadcast_layout", [](const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape) {
    const auto problem = ew::make_broadcast(a_shape, b_shape);
    py::dict layout;
    layout["shape"] = std::vector<int64_t>(problem.shape, problem.shape + problem.ndim);
    layout["stride_a"] = std::vector<int64_t>(problem.stride_a, problem.stride_a + problem.ndim);
    layout["stride_b"] = std::vector<int64_t>(problem.stride_b, problem.stride_b + problem.ndim);
    layout["numel"] = problem.numel;
    return layout;
  }, py::arg("a_shape"), py::arg("b_shape"), "The collapsed broadcast the kernels see (for tests).");

  m.def(
      "cast",
      [](std::uintptr_t x, const std::string& x_dtype, std::uintptr_t y, const std::string& dtype, int64_t numel,
         std::uintptr_t stream) {
        const auto from = ge2::dtype_from_name(x_dtype), to = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        ew::cast(as_pointer(x), from, as_pointer(y), to, numel, as_stream(stream));
      },
      py::arg("x"), py::arg("x_dtype"), py::arg("y"), py::arg("dtype"), py::arg("numel"), py::arg("stream"),
      "Enqueues y = x converted to dtype (float32, float16, bfloat16, float8_e4m3fn, float8_e5m2; FP8 "
      "saturates).");

  m.def("kernels", [] { return ge2::binding::kernel_list(ew::kernel_table()); },
        "The candidates with their constraints, best first.");
}
