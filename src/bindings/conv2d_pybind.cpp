// _ops_conv2d: the native face of the conv2d op. Raw device addresses (0 = absent), sizes and attributes in, work
// enqueued on `stream`; argument checking for users happens in graph_executor_v2.ops.conv2d before any of this runs.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

// geometry: (N, C, H, W, K, R, S, P, Q, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w, groups)
ge2::conv2d::Shape make_shape(const std::vector<int64_t>& geometry, const std::string& layout,
                              const std::string& dtype) {
  if (geometry.size() != 16) {
    throw std::invalid_argument("geometry: expected 16 integers, got " + std::to_string(geometry.size()));
  }
  ge2::conv2d::Shape s;
  s.n = geometry[0], s.c = geometry[1], s.h = geometry[2], s.w = geometry[3];
  s.k = geometry[4], s.r = geometry[5], s.s = geometry[6], s.p = geometry[7], s.q = geometry[8];
  s.stride_h = geometry[9], s.stride_w = geometry[10], s.pad_top = geometry[11], s.pad_left = geometry[12];
  s.dilation_h = geometry[13], s.dilation_w = geometry[14], s.groups = geometry[15];
  s.layout = ge2::conv2d::layout_from_name(layout);
  s.dtype = ge2::dtype_from_name(dtype);
  return s;
}

// scaled_conv2d's problem: geometry as make_shape's (groups 1, NHWC), y's dtype and the epilogue.
ge2::conv2d::ScaledConv make_scaled_conv(const std::vector<int64_t>& geometry, const std::string& x_dtype,
                                         const std::string& w_dtype, const std::string& out_dtype,
                                         const std::string& bias_dtype, bool has_residual, const std::string& act,
                                         float slope, float clip_low, float clip_high, bool with_amax) {
  ge2::conv2d::ScaledConv conv;
  conv.shape = make_shape(geometry, "NHWC", "float32");
  conv.shape.dtype = ge2::dtype_from_name(out_dtype, "out_dtype");
  conv.x_dtype = ge2::dtype_from_name(x_dtype, "x_dtype");
  conv.w_dtype = ge2::dtype_from_name(w_dtype, "w_dtype");
  if (!bias_dtype.empty()) conv.bias_dtype = ge2::dtype_from_name(bias_dtype, "bias_dtype");
  conv.epilogue = {ge2::act_from_name(act), !bias_dtype.empty(), has_residual, clip_low, clip_high};
  conv.slope = slope;
  conv.with_amax = with_amax;
  return conv;
}

}  // namespace

PYBIND11_MODULE(_ops_conv2d, m) {
  m.doc() = "GE2 conv2d: y = act(conv(x, w) + bias + residual), NCHW or NHWC";

  m.def(
      "forward",
      [](std::uintptr_t x, std::uintptr_t w, std::uintptr_t bias, std::uintptr_t residual, std::uintptr_t y,
         const std::vector<int64_t>& geometry, const std::string& layout, const std::string& dtype,
         const std::string& act, float slope, bool allow_tf32, float clip_low, float clip_high,
         const std::string& kernel, std::uintptr_t stream) {
        ge2::conv2d::ForwardArgs args;
        args.shape = make_shape(geometry, layout, dtype);
        args.x = as_pointer(x);
        args.w = as_pointer(w);
        args.bias = as_pointer(bias);
        args.residual = as_pointer(residual);
        args.y = as_pointer(y);
        args.act = ge2::act_from_name(act);
        args.slope = slope;
        args.allow_tf32 = allow_tf32;
        args.clip_low = clip_low;
        args.clip_high = clip_high;
        const auto named = ge2::conv2d::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        ge2::conv2d::forward(args, named, as_stream(stream));
      },
      py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("residual"), py::arg("y"), py::arg("geometry"), py::arg("layout"),
      py::arg("dtype"), py::arg("act"), py::arg("slope"), py::arg("allow_tf32"), py::arg("clip_low"),
      py::arg("clip_high"), py::arg("kernel"), py::arg("stream"),
      "Enqueues the convolution on `stream` on the named kernel (the selector's choice).");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t x, std::uintptr_t w, std::uintptr_t bias, std::uintptr_t dx,
         std::uintptr_t dw, std::uintptr_t dbias, const std::vector<int64_t>& geometry, const std::string& layout,
         const std::string& dtype, const std::string& act, float slope, bool allow_tf32, const std::string& kernel,
         std::uintptr_t stream) {
        ge2::conv2d::BackwardArgs args;
        args.shape = make_shape(geometry, layout, dtype);
        args.dy = as_pointer(dy);
        args.x = as_pointer(x);
        args.w = as_pointer(w);
        args.bias = as_pointer(bias);
        args.dx = as_pointer(dx);
        args.dw = as_pointer(dw);
        args.dbias = as_pointer(dbias);
        args.act = ge2::act_from_name(act);
        args.slope = slope;
        args.allow_tf32 = allow_tf32;
        const auto named = ge2::conv2d::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        ge2::conv2d::backward(args, named, as_stream(stream));
      },
      py::arg("dy"), py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("dx"), py::arg("dw"), py::arg("dbias"),
      py::arg("geometry"), py::arg("layout"), py::arg("dtype"), py::arg("act"), py::arg("slope"),
      py::arg("allow_tf32"), py::arg("kernel"), py::arg("stream"),
      "Enqueues dX, dW, dbias (each skipped when its address is 0) on `stream` on the named kernel (the selector's "
      "choice).");

  m.attr("has_cudnn") = ge2::conv2d::has_cudnn();
  m.attr("has_cudnn_graph") = ge2::conv2d::cudnn_graph_not_built_reason().empty();

  m.def(
      "prepare",
      [](const std::string& kernel, const std::vector<int64_t>& geometry, const std::string& layout,
         const std::string& dtype, const std::string& act, float slope, bool allow_tf32, float clip_low,
         float clip_high, bool has_bias, bool has_residual, bool backward) {
        const auto requested = ge2::conv2d::kernel_from_name(kernel);
        const auto shape = make_shape(geometry, layout, dtype);
        const ge2::conv2d::Epilogue epilogue{ge2::act_from_name(act), has_bias, has_residual, clip_low, clip_high};
        ge2::binding::ReleaseGil release;
        ge2::conv2d::prepare(requested, shape, epilogue, slope, allow_tf32, backward);
      },
      py::arg("kernel"), py::arg("geometry"), py::arg("layout"), py::arg("dtype"), py::arg("act"), py::arg("slope"),
      py::arg("allow_tf32"), py::arg("clip_low"), py::arg("clip_high"), py::arg("has_bias"), py::arg("has_residual"),
      py::arg("backward"),
      "Builds what `kernel` needs ahead of its first call (cudnn_graph: the cuDNN plans; not during CUDA graph "
      "capture); RuntimeError when cuDNN has no engine for the problem.");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, const std::vector<int64_t>& geometry, const std::string& layout,
         const std::string& dtype, const std::string& act, bool has_bias, bool has_residual, bool backward,
         float clip_low, float clip_high) {
        // the clip bounds too: a clip alone is an epilogue (legacy cuDNN declines it for 16-bit outputs)
        return ge2::conv2d::unsupported_reason(ge2::conv2d::kernel_from_name(kernel),
                                               make_shape(geometry, layout, dtype),
                                               {ge2::act_from_name(act), has_bias, has_residual, clip_low, clip_high},
                                               backward);
      },
      py::arg("kernel"), py::arg("geometry"), py::arg("layout"), py::arg("dtype"), py::arg("act"),
      py::arg("has_bias"), py::arg("has_residual"), py::arg("backward"), py::arg("clip_low"), py::arg("clip_high"),
      "Empty when `kernel` can run the problem (forward, or backward with `backward`); otherwise the reason.");

  m.def(
      "cutlass_sm90_pointwise_tile",
      [](const std::vector<int64_t>& geometry, const std::string& layout, const std::string& dtype,
         const std::string& act, int64_t sms, bool residual) {
        return ge2::conv2d::cutlass_sm90_pointwise_tile(make_shape(geometry, layout, dtype), ge2::act_from_name(act),
                                                        sms, residual);
      },
      py::arg("geometry"), py::arg("layout"), py::arg("dtype"), py::arg("act"), py::arg("sms"), py::arg("residual"),
      "The 1x1 GEMM tile cutlass_sm90's forward runs the problem (with a residual or not) in on a GPU of `sms` SMs, as "
      "GE2_CUTLASS_SM90_CONV_1X1 names it (that setting wins when set), or 'conv' for its conv collective.");

  // scaled_conv2d (FP8): its kernel shares this module's cuDNN graph code.
  m.def(
      "scaled_forward",
      [](std::uintptr_t x, std::uintptr_t w, std::uintptr_t scale_x, std::uintptr_t scale_w, std::uintptr_t bias,
         std::uintptr_t residual, std::uintptr_t scale_y, std::uintptr_t y, std::uintptr_t amax,
         const std::vector<int64_t>& geometry, const std::string& x_dtype, const std::string& w_dtype,
         const std::string& out_dtype, const std::string& bias_dtype, const std::string& act, float slope,
         float clip_low, float clip_high, std::uintptr_t stream) {
        ge2::conv2d::ScaledForwardArgs args;
        args.conv = make_scaled_conv(geometry, x_dtype, w_dtype, out_dtype, bias_dtype, residual != 0, act, slope,
                                     clip_low, clip_high, amax != 0);
        args.x = as_pointer(x);
        args.w = as_pointer(w);
        args.scale_x = as_pointer<const float>(scale_x);
        args.scale_w = as_pointer<const float>(scale_w);
        args.bias = as_pointer(bias);
        args.residual = as_pointer(residual);
        args.scale_y = as_pointer<const float>(scale_y);
        args.y = as_pointer(y);
        args.amax = as_pointer<float>(amax);
        ge2::binding::ReleaseGil release;
        ge2::conv2d::scaled_forward(args, as_stream(stream));
      },
      py::arg("x"), py::arg("w"), py::arg("scale_x"), py::arg("scale_w"), py::arg("bias"), py::arg("residual"),
      py::arg("scale_y"), py::arg("y"), py::arg("amax"), py::arg("geometry"), py::arg("x_dtype"), py::arg("w_dtype"),
      py::arg("out_dtype"), py::arg("bias_dtype"), py::arg("act"), py::arg("slope"), py::arg("clip_low"),
      py::arg("clip_high"), py::arg("stream"),
      "Enqueues scaled_conv2d (NHWC, FP8 x and w) on `stream`; amax 0: not computed.");

  m.def(
      "scaled_unsupported_reason",
      [](const std::vector<int64_t>& geometry, const std::string& x_dtype, const std::string& w_dtype,
         const std::string& out_dtype, const std::string& bias_dtype, bool has_residual, const std::string& act,
         float clip_low, float clip_high, bool with_amax, int major, int minor) {
        return ge2::conv2d::scaled_unsupported_reason(
            make_scaled_conv(geometry, x_dtype, w_dtype, out_dtype, bias_dtype, has_residual, act, 0.0f, clip_low,
                             clip_high, with_amax),
            major, minor);
      },
      py::arg("geometry"), py::arg("x_dtype"), py::arg("w_dtype"), py::arg("out_dtype"), py::arg("bias_dtype"),
      py::arg("has_residual"), py::arg("act"), py::arg("clip_low"), py::arg("clip_high"), py::arg("with_amax"),
      py::arg("major"), py::arg("minor"),
      "Empty when scaled_conv2d's cuDNN graph applies to the problem (bias_dtype '' for none), else why not.");

  m.def(
      "scaled_prepare",
      [](const std::vector<int64_t>& geometry, const std::string& x_dtype, const std::string& w_dtype,
         const std::string& out_dtype, const std::string& bias_dtype, bool has_residual, const std::string& act,
         float slope, float clip_low, float clip_high, bool with_amax) {
        const auto conv = make_scaled_conv(geometry, x_dtype, w_dtype, out_dtype, bias_dtype, has_residual, act,
                                           slope, clip_low, clip_high, with_amax);
        ge2::binding::ReleaseGil release;
        ge2::conv2d::scaled_prepare(conv);
      },
      py::arg("geometry"), py::arg("x_dtype"), py::arg("w_dtype"), py::arg("out_dtype"), py::arg("bias_dtype"),
      py::arg("has_residual"), py::arg("act"), py::arg("slope"), py::arg("clip_low"), py::arg("clip_high"),
      py::arg("with_amax"),
      "Builds scaled_conv2d's cuDNN plans (not during CUDA graph capture); RuntimeError with cuDNN's reason when it "
      "has no engine for the problem.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::conv2d::kernel_table()); },
        "The kernel candidates: name, priority, description, constraints.");
}
