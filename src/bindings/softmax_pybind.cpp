// _ops_softmax: the native face of softmax and log_softmax. Raw device addresses and the [outer, n, inner] view of
// the array in, work enqueued on `stream`; argument checking for users happens in graph_executor_v2.ops.softmax
// before any of this runs.
#include "api.hpp"
#include "c_launch.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

// The [outer, n, inner] problem of a forward or backward call, converted from the binding's arguments.
template <typename Args>
Args problem_args(const std::string& op, int64_t outer, int64_t n, int64_t inner, const std::string& dtype) {
  Args args;
  args.outer = outer;
  args.n = n;
  args.inner = inner;
  args.dtype = ge2::dtype_from_name(dtype);
  args.log = ge2::softmax::is_log_from_name(op);
  return args;
}

template <typename Args>
struct Bound {
  Args args;
  ge2::softmax::Kernel kernel;
};

}  // namespace

PYBIND11_MODULE(_ops_softmax, m) {
  m.doc() = "GE2 softmax / log_softmax over one axis of a contiguous array seen as [outer, n, inner]";

  m.def(
      "forward",
      [](const std::string& op, std::uintptr_t x, std::uintptr_t y, int64_t outer, int64_t n, int64_t inner,
         const std::string& dtype, const std::string& kernel, std::uintptr_t stream) {
        auto args = problem_args<ge2::softmax::ForwardArgs>(op, outer, n, inner, dtype);
        args.x = as_pointer(x);
        args.y = as_pointer(y);
        const auto requested = ge2::softmax::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::softmax::kernel_name(ge2::softmax::forward(args, requested, as_stream(stream))));
      },
      py::arg("op"), py::arg("x"), py::arg("y"), py::arg("outer"), py::arg("n"), py::arg("inner"), py::arg("dtype"),
      py::arg("kernel"), py::arg("stream"),
      "Enqueues y = op(x) over the middle axis of [outer, n, inner]; returns the name of the kernel that ran.");

  m.def(
      "backward",
      [](const std::string& op, std::uintptr_t y, std::uintptr_t dy, std::uintptr_t dx, int64_t outer, int64_t n,
         int64_t inner, const std::string& dtype, const std::string& kernel, std::uintptr_t stream) {
        auto args = problem_args<ge2::softmax::BackwardArgs>(op, outer, n, inner, dtype);
        args.y = as_pointer(y);
        args.dy = as_pointer(dy);
        args.dx = as_pointer(dx);
        const auto requested = ge2::softmax::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(ge2::softmax::kernel_name(ge2::softmax::backward(args, requested, as_stream(stream))));
      },
      py::arg("op"), py::arg("y"), py::arg("dy"), py::arg("dx"), py::arg("outer"), py::arg("n"), py::arg("inner"),
      py::arg("dtype"), py::arg("kernel"), py::arg("stream"),
      "Enqueues dx from the forward output y and dy; returns the name of the kernel that ran.");

  using ForwardBound = Bound<ge2::softmax::ForwardArgs>;
  m.def(
      "bind_forward",
      [](const std::string& op, int64_t outer, int64_t n, int64_t inner, const std::string& dtype,
         const std::string& kernel) {
        const ForwardBound bound{problem_args<ge2::softmax::ForwardArgs>(op, outer, n, inner, dtype),
                                 ge2::softmax::kernel_from_name(kernel)};
        return ge2::binding::make_c_launch<ForwardBound>(
            bound, 1, 1, [](ForwardBound& b, const std::uintptr_t* in, const std::uintptr_t* out, cudaStream_t stream) {
              auto args = b.args;
              args.x = as_pointer(in[0]);
              args.y = as_pointer(out[0]);
              ge2::softmax::forward(args, b.kernel, stream);
            });
      },
      py::arg("op"), py::arg("outer"), py::arg("n"), py::arg("inner"), py::arg("dtype"), py::arg("kernel"),
      "forward for one problem as a C launch (input x, output y), its arguments converted once.");

  using BackwardBound = Bound<ge2::softmax::BackwardArgs>;
  m.def(
      "bind_backward",
      [](const std::string& op, int64_t outer, int64_t n, int64_t inner, const std::string& dtype,
         const std::string& kernel) {
        const BackwardBound bound{problem_args<ge2::softmax::BackwardArgs>(op, outer, n, inner, dtype),
                                  ge2::softmax::kernel_from_name(kernel)};
        return ge2::binding::make_c_launch<BackwardBound>(
            bound, 2, 1,
            [](BackwardBound& b, const std::uintptr_t* in, const std::uintptr_t* out, cudaStream_t stream) {
              auto args = b.args;
              args.dy = as_pointer(in[0]);
              args.y = as_pointer(in[1]);
              args.dx = as_pointer(out[0]);
              ge2::softmax::backward(args, b.kernel, stream);
            });
      },
      py::arg("op"), py::arg("outer"), py::arg("n"), py::arg("inner"), py::arg("dtype"), py::arg("kernel"),
      "backward for one problem as a C launch (inputs dy, y; output dx), its arguments converted once.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t n, int64_t inner, bool backward) {
        return ge2::softmax::unsupported_reason(ge2::softmax::kernel_from_name(kernel), n, inner, backward);
      },
      py::arg("kernel"), py::arg("n"), py::arg("inner"), py::arg("backward"),
      "Empty string when the kernel can run the problem, else the reason it cannot.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::softmax::kernel_table()); },
        "The kernel variants: name, priority, description, constraints.");
}
