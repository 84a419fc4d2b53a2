// _ops_cross_entropy: the native face of the cross_entropy op. Raw device addresses (0 = absent) and sizes in, work
// enqueued on `stream`; argument checking for users happens in graph_executor_v2.ops.cross_entropy first.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

ge2::cross_entropy::Args make_args(std::uintptr_t logits, std::uintptr_t labels, std::uintptr_t dloss,
                                   std::uintptr_t loss, std::uintptr_t dlogits, int64_t rows, int64_t cols,
                                   const std::string& dtype, const std::string& label_dtype,
                                   const std::string& reduction, int64_t ignore_index,
                                   const std::string& loss_dtype = "") {
  ge2::cross_entropy::Args args;
  args.logits = as_pointer(logits);
  args.labels = as_pointer(labels);
  args.dloss = as_pointer(dloss);
  args.loss = as_pointer(loss);
  args.dlogits = as_pointer(dlogits);
  args.rows = rows;
  args.cols = cols;
  args.dtype = ge2::dtype_from_name(dtype);
  args.loss_dtype = loss_dtype.empty() ? args.dtype : ge2::dtype_from_name(loss_dtype, "loss_dtype");
  args.label_dtype = ge2::dtype_from_name(label_dtype, "labels");
  args.reduction = ge2::cross_entropy::reduction_from_name(reduction);
  args.ignore_index = ignore_index;
  return args;
}

std::string run(const ge2::cross_entropy::Args& args, const std::string& kernel, bool check_labels,
                std::uintptr_t stream) {
  const auto requested = ge2::cross_entropy::kernel_from_name(kernel);
  ge2::binding::ReleaseGil release;
  return ge2::cross_entropy::kernel_name(ge2::cross_entropy::run(args, requested, check_labels, as_stream(stream)));
}

}  // namespace

PYBIND11_MODULE(_ops_cross_entropy, m) {
  m.doc() = "GE2 cross_entropy: fused softmax + negative log-likelihood (+ gradient) over rows of logits";

  m.def(
      "forward",
      [](std::uintptr_t logits, std::uintptr_t labels, std::uintptr_t loss, std::uintptr_t dlogits, int64_t rows,
         int64_t cols, const std::string& dtype, const std::string& label_dtype, const std::string& reduction,
         int64_t ignore_index, const std::string& kernel, bool check_labels, std::uintptr_t stream,
         const std::string& loss_dtype) {
        return run(make_args(logits, labels, 0, loss, dlogits, rows, cols, dtype, label_dtype, reduction,
                             ignore_index, loss_dtype),
                   kernel, check_labels, stream);
      },
      py::arg("logits"), py::arg("labels"), py::arg("loss"), py::arg("dlogits"), py::arg("rows"), py::arg("cols"),
      py::arg("dtype"), py::arg("label_dtype"), py::arg("reduction"), py::arg("ignore_index"), py::arg("kernel"),
      py::arg("check_labels"), py::arg("stream"), py::arg("loss_dtype") = "",
      "Enqueues the loss; with dlogits != 0 also the gradient of the loss (upstream gradient 1) in the same pass. "
      "loss_dtype: the reduced loss's dtype, '' for the logits' dtype or 'float32' (16-bit logits, a float32 "
      "loss: mixed precision's loss, not rounded to 16 bits). Returns the kernel that ran. check_labels waits for "
      "the stream and raises ValueError on a bad label.");

  m.def(
      "backward",
      [](std::uintptr_t dloss, std::uintptr_t logits, std::uintptr_t labels, std::uintptr_t dlogits, int64_t rows,
         int64_t cols, const std::string& dtype, const std::string& label_dtype, const std::string& reduction,
         int64_t ignore_index, const std::string& kernel, bool check_labels, std::uintptr_t stream) {
        return run(make_args(logits, labels, dloss, 0, dlogits, rows, cols, dtype, label_dtype, reduction,
                             ignore_index),
                   kernel, check_labels, stream);
      },
      py::arg("dloss"), py::arg("logits"), py::arg("labels"), py::arg("dlogits"), py::arg("rows"), py::arg("cols"),
      py::arg("dtype"), py::arg("label_dtype"), py::arg("reduction"), py::arg("ignore_index"), py::arg("kernel"),
      py::arg("check_labels"), py::arg("stream"),
      "Enqueues dlogits = (softmax - onehot) * upstream, recomputing the softmax (dloss = 0 means upstream 1).");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t cols, const std::string& dtype, bool vectorizable) {
        return ge2::cross_entropy::unsupported_reason(ge2::cross_entropy::kernel_from_name(kernel), cols,
                                                      ge2::dtype_from_name(dtype), vectorizable);
      },
      py::arg("kernel"), py::arg("cols"), py::arg("dtype"), py::arg("vectorizable"),
      "Empty string when the kernel can run rows of this length, else the reason it cannot.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::cross_entropy::kernel_table()); });
}
