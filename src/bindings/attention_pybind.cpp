// _ops_attention: the native face of attention. Raw device addresses and sizes in, work enqueued on `stream`;
// argument checking for users happens in graph_executor_v2.ops.attention before any of this runs.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

ge2::attention::Shape make_shape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k,
                                 int64_t head_dim, bool seq_major, double scale, bool causal,
                                 const std::string& dtype, int64_t bias_batch = 0, int64_t bias_heads = 0,
                                 int64_t window_left = -1, int64_t window_right = -1, double softcap = 0.0) {
  ge2::attention::Shape shape;
  shape.batch = batch;
  shape.heads_q = heads_q;
  shape.heads_kv = heads_kv;
  shape.seq_q = seq_q;
  shape.seq_k = seq_k;
  shape.head_dim = head_dim;
  shape.seq_major = seq_major;
  shape.scale = static_cast<float>(scale);
  shape.causal = causal;
  shape.dtype = ge2::dtype_from_name(dtype);
  shape.bias_batch = bias_batch;
  shape.bias_heads = bias_heads;
  shape.window_left = window_left;
  shape.window_right = window_right;
  shape.softcap = static_cast<float>(softcap);
  return shape;
}

}  // namespace

PYBIND11_MODULE(_ops_attention, m) {
  m.doc() = "GE2 attention: O = softmax(softcap(scale * Q K^T) + bias + causal and window masks) V, with the row "
            "log-sum-exp saved";

  m.def(
      "forward",
      [](std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t lse, int64_t batch,
         int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k, int64_t head_dim, bool seq_major,
         double scale, bool causal, const std::string& dtype, const std::string& kernel, std::uintptr_t stream,
         std::uintptr_t bias, int64_t bias_batch, int64_t bias_heads, int64_t window_left, int64_t window_right,
         double softcap) {
        ge2::attention::ForwardArgs args;
        args.shape = make_shape(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, seq_major, scale, causal, dtype,
                                bias_batch, bias_heads, window_left, window_right, softcap);
        args.q = as_pointer(q);
        args.k = as_pointer(k);
        args.v = as_pointer(v);
        args.bias = as_pointer(bias);
        args.o = as_pointer(o);
        args.lse = as_pointer<float>(lse);
        const auto named = ge2::attention::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        ge2::attention::forward(args, named, as_stream(stream));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("batch"), py::arg("heads_q"),
      py::arg("heads_kv"), py::arg("seq_q"), py::arg("seq_k"), py::arg("head_dim"), py::arg("seq_major"),
      py::arg("scale"), py::arg("causal"), py::arg("dtype"), py::arg("kernel"), py::arg("stream"),
      py::arg("bias") = 0, py::arg("bias_batch") = 0, py::arg("bias_heads") = 0, py::arg("window_left") = -1,
      py::arg("window_right") = -1, py::arg("softcap") = 0.0,
      "Enqueues O and the float32 row log-sum-exp on the named kernel (the selector's choice). bias (0: none): the "
      "additive [bias_batch, bias_heads, seq_q, seq_k] bias; window_left, window_right: the sliding window (-1: "
      "unbounded); softcap: c > 0 caps the scores at c tanh(s / c) (0: off).");

  m.def(
      "backward",
      [](std::uintptr_t dout, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
         std::uintptr_t lse, std::uintptr_t dq, std::uintptr_t dk, std::uintptr_t dv, int64_t batch, int64_t heads_q,
         int64_t heads_kv, int64_t seq_q, int64_t seq_k, int64_t head_dim, bool seq_major, double scale, bool causal,
         const std::string& dtype, const std::string& kernel, std::uintptr_t stream, std::uintptr_t bias,
         int64_t bias_batch, int64_t bias_heads, int64_t window_left, int64_t window_right, double softcap) {
        ge2::attention::BackwardArgs args;
        args.shape = make_shape(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, seq_major, scale, causal, dtype,
                                bias_batch, bias_heads, window_left, window_right, softcap);
        args.dout = as_pointer(dout);
        args.q = as_pointer(q);
        args.k = as_pointer(k);
        args.v = as_pointer(v);
        args.bias = as_pointer(bias);
        args.o = as_pointer(o);
        args.lse = as_pointer<const float>(lse);
        args.dq = as_pointer(dq);
        args.dk = as_pointer(dk);
        args.dv = as_pointer(dv);
        const auto named = ge2::attention::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        ge2::attention::backward(args, named, as_stream(stream));
      },
      py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("dq"),
      py::arg("dk"), py::arg("dv"), py::arg("batch"), py::arg("heads_q"), py::arg("heads_kv"), py::arg("seq_q"),
      py::arg("seq_k"), py::arg("head_dim"), py::arg("seq_major"), py::arg("scale"), py::arg("causal"),
      py::arg("dtype"), py::arg("kernel"), py::arg("stream"), py::arg("bias") = 0, py::arg("bias_batch") = 0,
      py::arg("bias_heads") = 0, py::arg("window_left") = -1, py::arg("window_right") = -1, py::arg("softcap") = 0.0,
      "Enqueues dQ, dK, dV from dO and the saved O and log-sum-exp on the named kernel (the selector's choice).");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t head_dim, const std::string& dtype, bool bias, int64_t seq_q,
         int64_t seq_k, bool causal, int64_t window_left, int64_t window_right, double softcap) {
        auto shape = make_shape(1, 1, 1, seq_q, seq_k, head_dim, false, 1.0, causal, dtype, bias ? 1 : 0, bias ? 1 : 0,
                                window_left, window_right, softcap);
        return ge2::attention::unsupported_reason(ge2::attention::kernel_from_name(kernel), shape);
      },
      py::arg("kernel"), py::arg("head_dim"), py::arg("dtype") = "float16", py::arg("bias") = false,
      py::arg("seq_q") = 1, py::arg("seq_k") = 1, py::arg("causal") = false, py::arg("window_left") = -1,
      py::arg("window_right") = -1, py::arg("softcap") = 0.0,
      "Empty string when the kernel can run a problem of this head_dim and dtype (with an additive bias; of these "
      "lengths, causal mask, sliding window and soft cap), else the reason.");

  m.attr("has_cudnn") = ge2::attention::cudnn_not_built_reason().empty();

  m.def(
      "prepare",
      [](const std::string& kernel, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k,
         int64_t head_dim, bool seq_major, double scale, bool causal, const std::string& dtype, bool backward,
         int64_t bias_batch, int64_t bias_heads, int64_t window_left, int64_t window_right, double softcap) {
        const auto shape = make_shape(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, seq_major, scale, causal,
                                      dtype, bias_batch, bias_heads, window_left, window_right, softcap);
        const auto requested = ge2::attention::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        ge2::attention::prepare(requested, shape, backward);
      },
      py::arg("kernel"), py::arg("batch"), py::arg("heads_q"), py::arg("heads_kv"), py::arg("seq_q"),
      py::arg("seq_k"), py::arg("head_dim"), py::arg("seq_major"), py::arg("scale"), py::arg("causal"),
      py::arg("dtype"), py::arg("backward"), py::arg("bias_batch") = 0, py::arg("bias_heads") = 0,
      py::arg("window_left") = -1, py::arg("window_right") = -1, py::arg("softcap") = 0.0,
      "Builds what `kernel` needs ahead of its first call (cudnn: the cuDNN plans; not during CUDA graph capture); "
      "RuntimeError when cuDNN has no engine for the problem.");

  m.def(
      "workspace_bytes",
      [](const std::string& kernel, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_k,
         int64_t head_dim, bool seq_major, const std::string& dtype, bool backward) {
        const auto shape =
            make_shape(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, seq_major, 1.0, false, dtype);
        return ge2::attention::workspace_bytes(ge2::attention::kernel_from_name(kernel), shape, backward);
      },
      py::arg("kernel"), py::arg("batch"), py::arg("heads_q"), py::arg("heads_kv"), py::arg("seq_q"),
      py::arg("seq_k"), py::arg("head_dim"), py::arg("seq_major"), py::arg("dtype"), py::arg("backward"),
      "Bytes of per-stream workspace the kernel's forward or backward takes for the problem (no device work).");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::attention::kernel_table()); },
        "The kernel variants: name, priority, description, constraints.");
}
