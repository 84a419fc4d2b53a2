// _ops_batch_norm: the native face of batch_norm. Raw device addresses, sizes and a stream handle in, work
// enqueued; argument checking for users happens in graph_executor_v2.ops.batch_norm before any of this runs.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

ge2::batch_norm::Shape make_shape(int64_t batch, int64_t channels, int64_t spatial, const std::string& layout) {
  return {batch, channels, spatial, ge2::batch_norm::layout_from_name(layout)};
}

}  // namespace

PYBIND11_MODULE(_ops_batch_norm, m) {
  m.doc() = "GE2 batch_norm over the channels of NCHW or NHWC arrays (float32 statistics and parameters)";

  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t beta, std::uintptr_t running_mean,
         std::uintptr_t running_var, std::uintptr_t y, std::uintptr_t saved_mean, std::uintptr_t saved_invstd,
         std::uintptr_t running_mean_out, std::uintptr_t running_var_out, int64_t batch, int64_t channels,
         int64_t spatial, const std::string& layout, const std::string& dtype, bool training, float momentum,
         float eps, std::uintptr_t stream) {
        ge2::batch_norm::ForwardArgs args;
        args.x = as_pointer(x);
        args.gamma = as_pointer<const float>(gamma);
        args.beta = as_pointer<const float>(beta);
        args.running_mean = as_pointer<const float>(running_mean);
        args.running_var = as_pointer<const float>(running_var);
        args.y = as_pointer(y);
        args.saved_mean = as_pointer<float>(saved_mean);
        args.saved_invstd = as_pointer<float>(saved_invstd);
        args.running_mean_out = as_pointer<float>(running_mean_out);
        args.running_var_out = as_pointer<float>(running_var_out);
        args.shape = make_shape(batch, channels, spatial, layout);
        args.dtype = ge2::dtype_from_name(dtype);
        args.training = training;
        args.momentum = momentum;
        args.eps = eps;
        ge2::binding::ReleaseGil release;
        ge2::batch_norm::forward(args, as_stream(stream));
      },
      py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("running_mean"), py::arg("running_var"), py::arg("y"),
      py::arg("saved_mean"), py::arg("saved_invstd"), py::arg("running_mean_out"), py::arg("running_var_out"),
      py::arg("batch"), py::arg("channels"), py::arg("spatial"), py::arg("layout"), py::arg("dtype"),
      py::arg("training"), py::arg("momentum"), py::arg("eps"), py::arg("stream"),
      "Enqueues y, saved_mean, saved_invstd and running_*_out (these may alias running_* for an in-place update).");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t x, std::uintptr_t gamma, std::uintptr_t saved_mean,
         std::uintptr_t saved_invstd, std::uintptr_t dx, std::uintptr_t dgamma, std::uintptr_t dbeta, int64_t batch,
         int64_t channels, int64_t spatial, const std::string& layout, const std::string& dtype, bool training,
         std::uintptr_t stream) {
        ge2::batch_norm::BackwardArgs args;
        args.dy = as_pointer(dy);
        args.x = as_pointer(x);
        args.gamma = as_pointer<const float>(gamma);
        args.saved_mean = as_pointer<const float>(saved_mean);
        args.saved_invstd = as_pointer<const float>(saved_invstd);
        args.dx = as_pointer(dx);
        args.dgamma = as_pointer<float>(dgamma);
        args.dbeta = as_pointer<float>(dbeta);
        args.shape = make_shape(batch, channels, spatial, layout);
        args.dtype = ge2::dtype_from_name(dtype);
        args.training = training;
        ge2::binding::ReleaseGil release;
        ge2::batch_norm::backward(args, as_stream(stream));
      },
      py::arg("dy"), py::arg("x"), py::arg("gamma"), py::arg("saved_mean"), py::arg("saved_invstd"), py::arg("dx"),
      py::arg("dgamma"), py::arg("dbeta"), py::arg("batch"), py::arg("channels"), py::arg("spatial"),
      py::arg("layout"), py::arg("dtype"), py::arg("training"), py::arg("stream"),
      "Enqueues dx, dgamma, dbeta (float32) from the saved statistics of the forward.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::batch_norm::kernel_table()); },
        "The kernels: name, priority, description, constraints.");
}
