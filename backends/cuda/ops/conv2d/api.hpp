// conv2d: y = act(conv(x, w) + bias + residual), NCHW or NHWC, stride, explicit padding, dilation, groups; float32
// accumulation, the epilogue in float32 and y rounded once.
// Weights: [K, C/groups, R, S] for NCHW (PyTorch's layout), [K, R, S, C/groups] for NHWC.
#pragma once
#include <cmath>  // activation.hpp's float math in host-compiled code (the binding)
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation.hpp"
#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::conv2d {

enum class Layout { NCHW, NHWC };
enum class Kernel { CudnnGraph, Cudnn, Im2colGemm, ImplicitGemm, Depthwise, CutlassSm90 };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);
Layout layout_from_name(const std::string& name);

struct Shape {
  int64_t n = 0, c = 0, h = 0, w = 0;   // input
  int64_t k = 0, r = 0, s = 0;          // filters
  int64_t p = 0, q = 0;                 // output height, width
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;    // bottom/right padding only shows in p, q
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  Layout layout = Layout::NCHW;
  DType dtype = DType::Float32;
};

struct ForwardArgs {
  Shape shape;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;      // nullptr: no bias
  const void* residual = nullptr;  // nullptr: none; else y's shape and layout, added before the activation
  void* y = nullptr;
  Act act = Act::None;
  float slope = 0.01f;
  // y clipped to [clip_low, clip_high] after the activation (relu6, hardtanh); infinite bounds clip nothing
  float clip_low = -std::numeric_limits<float>::infinity();
  float clip_high = std::numeric_limits<float>::infinity();
  bool allow_tf32 = false;
};

struct BackwardArgs {
  Shape shape;
  const void* dy = nullptr;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;  // read (with x, w) to recompute the pre-activation when act != None
  void* dx = nullptr;          // each gradient is skipped when nullptr
  void* dw = nullptr;
  void* dbias = nullptr;
  Act act = Act::None;
  float slope = 0.01f;
  bool allow_tf32 = false;
};

// Checks sizes and pointers; throws std::invalid_argument naming the argument.
void check_shape(const Shape& shape);

// Run `kernel`, which the Python selector chose (nothing here chooses): std::invalid_argument naming why when it
// cannot run the problem (implicit_gemm, cutlass_sm90: also a tensor not 16-byte aligned), std::runtime_error when
// cuDNN declines it at run time (no engine or algorithm, an offset view).
void forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream);
void backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// Whether this build has the cuDNN candidate (CMake found cuDNN: GE2_WITH_CUDNN).
bool has_cudnn();
// Empty when this build has the cudnn_graph candidate (cuDNN and the cuDNN frontend headers: GE2_WITH_CUDNN_FRONTEND),
// else what was missing (its capability checks then say "not built: " and this).
std::string cudnn_graph_not_built_reason();

// The forward's epilogue, y = clip(act(conv + bias + residual)), as the capability checks and plan caches see it.
struct Epilogue {
  Act act = Act::None;
  bool has_bias = false;
  bool has_residual = false;
  float clip_low = -std::numeric_limits<float>::infinity();
  float clip_high = std::numeric_limits<float>::infinity();
  bool has_clip() const {
    return clip_low > -std::numeric_limits<float>::infinity() || clip_high < std::numeric_limits<float>::infinity();
  }
  bool any() const { return act != Act::None || has_bias || has_residual || has_clip(); }
};

inline Epilogue epilogue_of(const ForwardArgs& args) {
  return {args.act, args.bias != nullptr, args.residual != nullptr, args.clip_low, args.clip_high};
}

// The epilogue's last step; NaN passes (as the pointwise clip).
__host__ __device__ __forceinline__ float clip_value(float v, float low, float high) {
  return v < low ? low : (v > high ? high : v);
}

// Empty when `kernel` can run the problem; otherwise the reason it cannot (backward: the epilogue's act only).
std::string unsupported_reason(Kernel kernel, const Shape& shape, const Epilogue& epilogue, bool backward);

// Builds what `kernel` needs for the problem ahead of its first call (cudnn_graph: its cuDNN plans; the other
// kernels need nothing); throws std::runtime_error when cuDNN has no engine for it, so a registry can take the next
// candidate. Not during CUDA graph capture.
void prepare(Kernel kernel, const Shape& shape, const Epilogue& epilogue, float slope, bool allow_tf32, bool backward);

// ---- internal: shared by launcher.cu, kernels/*.cu and backward.cu ------------------------------------------

// Throws std::invalid_argument naming `kernel` and the reason when it cannot run the problem.
void require_supported(Kernel kernel, const Shape& shape, const Epilogue& epilogue, bool backward);
// A named kernel that declined at run time (no cuDNN engine or algorithm for the problem): std::runtime_error.
[[noreturn]] void throw_declined(Kernel kernel, const std::string& why);

// The column matrix of the implicit GEMM: NCHW [groups][C/g * R * S][N * P * Q], NHWC [groups][N * P * Q][R * S *
// C/g]. col2im is its adjoint (a gather: each input element sums the columns it appears in, no atomics).
void launch_im2col(const Shape& shape, const void* x, void* col, cudaStream_t stream);
void launch_col2im(const Shape& shape, const float* dcol, void* dx, cudaStream_t stream);

// The GEMM result in its layout (NCHW: [K][N * P * Q], NHWC: [N * P * Q][K], float32) -> y = clip(act(acc + bias +
// residual)) of `args` (its bias, residual, y, act, slope and clip); with acc_in_y_layout, acc is laid out as y (and
// may be y itself: float32 in place).
void launch_epilogue(const ForwardArgs& args, const float* acc, bool acc_in_y_layout, cudaStream_t stream);
// dz = dy * act'(acc + bias) in the GEMM layout, of the op's dtype (acc unused when act == None).
void launch_output_grad(const Shape& shape, const void* dy, const float* acc, const void* bias, void* dz, Act act,
                        float slope, cudaStream_t stream);
// dbias[k] = sum of dz over N, P, Q; dz in the GEMM layout, or in y's layout when gemm_layout is false.
void launch_bias_grad(const Shape& shape, const void* dz, void* dbias, bool gemm_layout, cudaStream_t stream);

// GE2's direct depthwise forward (kernels/depthwise.cu): groups == C == K, any layout and float dtype, the epilogue
// fused in float32.
std::string depthwise_unsupported_reason(const Shape& shape, bool backward);
void depthwise_forward(const ForwardArgs& args, cudaStream_t stream);

// The cuDNN graph-API candidate (kernels/cudnn_graph.cpp); without the frontend in the build the reason says so and
// the launches throw. The launches return why they enqueued nothing (cuDNN has no engine for the problem), else "".
std::string cudnn_graph_unsupported_reason(const Shape& shape, const Epilogue& epilogue, bool backward);
void cudnn_graph_prepare(const Shape& shape, const Epilogue& epilogue, float slope, bool allow_tf32, bool backward);
std::string cudnn_graph_forward(const ForwardArgs& args, cudaStream_t stream);
std::string cudnn_graph_backward(const BackwardArgs& args, cudaStream_t stream);

// ---- scaled_conv2d: the FP8 forward (kernels/cudnn_graph.cpp), cudnn_graph's graph with FP8 x and w --------------
// y = clip(act(scale_x * scale_w * conv(x, w) + bias + residual)), times scale_y for an FP8 y, and amax = max |...|
// before scale_y; x [N, H, W, C] and w [K, R, S, C] in FP8 (NHWC, groups 1), the convolution accumulated in float32
// and the epilogue computed in float32 by the graph's pointwise nodes. Scales and amax are float32 device scalars.
struct ScaledConv {
  Shape shape;  // NHWC, groups 1; shape.dtype is y's dtype (float16, bfloat16 or FP8)
  DType x_dtype = DType::Float8E4M3, w_dtype = DType::Float8E4M3;
  DType bias_dtype = DType::BFloat16;  // y's dtype for a 16-bit y, bfloat16 for an FP8 one
  Epilogue epilogue;
  float slope = 0.01f;
  bool with_amax = false;  // an FP8 y's amax (cuDNN's AMAX reduction before scale_y)
};

struct ScaledForwardArgs {
  ScaledConv conv;
  const void* x = nullptr;
  const void* w = nullptr;
  const float* scale_x = nullptr;  // dequantization factors: real x = x * scale_x
  const float* scale_w = nullptr;
  const void* bias = nullptr;      // [K], when conv.epilogue.has_bias
  const void* residual = nullptr;  // y's shape, a 16-bit y's dtype, when conv.epilogue.has_residual
  const float* scale_y = nullptr;  // an FP8 y's quantization factor
  void* y = nullptr;
  float* amax = nullptr;           // when conv.with_amax
};

// Empty when the FP8 graph applies to the problem on a GPU of compute capability major.minor (built with the cuDNN
// frontend, sm_89+, NHWC, groups 1, C and K multiples of 16, the dtypes above), else why not. Whether cuDNN has an
// engine for it shows only when its plans are built (scaled_prepare).
std::string scaled_unsupported_reason(const ScaledConv& conv, int major, int minor);
// Builds the problem's cuDNN plans; std::runtime_error with cuDNN's reason when it has no engine for it (a registry
// then takes the next candidate, an FP8 pass keeps the convolution in 16 bits). Not during CUDA graph capture.
void scaled_prepare(const ScaledConv& conv);
// Enqueues the FP8 convolution; std::invalid_argument for bad arguments, std::runtime_error when cuDNN has no engine.
void scaled_forward(const ScaledForwardArgs& args, cudaStream_t stream);

// The legacy cuDNN candidate (kernels/cudnn.cu); without cuDNN in the build the reason says so and the launches throw.
// The launches return false, enqueuing nothing, when cudnnFind* returned no working algorithm for the problem.
std::string cudnn_unsupported_reason(const Shape& shape, const Epilogue& epilogue, bool backward);
bool cudnn_forward(const ForwardArgs& args, cudaStream_t stream);
bool cudnn_backward(const BackwardArgs& args, cudaStream_t stream);

// GE2's implicit-GEMM tensor-core forward (kernels/implicit_gemm.cu): NHWC, float16/bfloat16, groups 1, C % 8 == 0.
// It also needs x and w 16-byte aligned (checked per call: implicit_gemm_aligned). Its tile configs, listed by
// implicit_gemm_configs() ("0 = 128x64 4 warps 3 stages, ..."), are chosen per problem, or forced for every launch
// by the environment variable GE2_IMPLICIT_GEMM_CONFIG=<index> (read per launch; a bad index is std::invalid_argument).
std::string implicit_gemm_configs();
std::string implicit_gemm_unsupported_reason(const Shape& shape, bool backward);
bool implicit_gemm_aligned(const ForwardArgs& args);
void implicit_gemm_forward(const ForwardArgs& args, cudaStream_t stream);

// The CUTLASS 3.x sm90 implicit-GEMM kernels (kernels/cutlass_sm90.cu, instantiations in cutlass/, built for sm_90a
// when CMake finds CUTLASS's headers): NHWC, float16/bfloat16, groups 1, C and K multiples of 8, TMA's im2col limits
// on padding, filter extent and stride; the forward with the whole epilogue fused, the backward (dgrad, wgrad, GE2's
// dbias reduction) with act none and stride 1, wgrad's reduction in slices through a per-stream workspace where its
// output tiles are few. Every tensor 16-byte aligned (checked per call: the forward's
// cutlass_sm90_aligned, the backward throws std::invalid_argument). Without CUTLASS (cutlass_build.hpp) the
// unsupported reason says why and the launches throw.
std::string cutlass_sm90_unsupported_reason(const Shape& shape, const Epilogue& epilogue, bool backward);
bool cutlass_sm90_aligned(const ForwardArgs& args);
// The 1x1 GEMM tile cutlass_sm90's forward runs `shape` in on a GPU of `sms` SMs, as GE2_CUTLASS_SM90_CONV_1X1 names
// it (that setting, when set, wins), or "conv" for the conv collective (not a pointwise problem with a
// piecewise-linear activation); std::invalid_argument for a bad setting. Needs no GPU and no CUTLASS.
std::string cutlass_sm90_pointwise_tile(const Shape& shape, Act act, int64_t sms, bool residual);
void cutlass_sm90_forward(const ForwardArgs& args, cudaStream_t stream);
void cutlass_sm90_backward(const BackwardArgs& args, cudaStream_t stream);

// Elements of the im2col column matrix: C * R * S * N * P * Q.
std::size_t im2col_col_elements(const Shape& shape);

// Runs the forward GEMMs (im2col + batched GEMM) into the float32 accumulator in the GEMM layout.
void im2col_gemm_accumulate(const Shape& shape, const void* x, const void* w, void* col, float* acc, bool allow_tf32,
                            cudaStream_t stream);

}  // namespace ge2::conv2d
