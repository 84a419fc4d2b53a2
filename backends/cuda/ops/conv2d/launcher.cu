// conv2d launcher: argument checks, the kernel table and the forward of the named kernel (the Python selector
// chooses); the im2col_gemm forward (its GEMM is _common/batched_gemm.hpp).
#include <string>

#include "api.hpp"
#include "batched_gemm.hpp"
#include "cutlass_build.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::conv2d {

Kernel kernel_from_name(const std::string& name) {
  if (name == "cudnn_graph") return Kernel::CudnnGraph;
  if (name == "cudnn") return Kernel::Cudnn;
  if (name == "im2col_gemm") return Kernel::Im2colGemm;
  if (name == "implicit_gemm") return Kernel::ImplicitGemm;
  if (name == "depthwise") return Kernel::Depthwise;
  if (name == "cutlass_sm90") return Kernel::CutlassSm90;
  throw std::invalid_argument("kernel: expected one of cudnn_graph, cutlass_sm90, implicit_gemm, depthwise, cudnn, "
                              "im2col_gemm (conv2d's kernels), got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::CudnnGraph: return "cudnn_graph";
    case Kernel::Cudnn: return "cudnn";
    case Kernel::Im2colGemm: return "im2col_gemm";
    case Kernel::ImplicitGemm: return "implicit_gemm";
    case Kernel::Depthwise: return "depthwise";
    case Kernel::CutlassSm90: return "cutlass_sm90";
  }
  return "unknown";
}

Layout layout_from_name(const std::string& name) {
  if (name == "NCHW") return Layout::NCHW;
  if (name == "NHWC") return Layout::NHWC;
  throw std::invalid_argument("layout: expected NCHW or NHWC, got '" + name + "'");
}

bool has_cudnn() { return GE2_WITH_CUDNN != 0; }

std::vector<KernelInfo> kernel_table() {
  const std::string graph_not_built = cudnn_graph_not_built_reason();
  const std::string cutlass_not_built = cutlass_not_built_reason();
  return {
      {"cudnn_graph", 40,
       graph_not_built.empty()
           ? "cuDNN's graph API through the cuDNN frontend: conv_fprop with bias, residual and activation fused as "
             "pointwise nodes (float32 intermediates, y rounded once), conv_dgrad, conv_wgrad (dbias by GE2's reduction); plans from heuristics mode A (the fallback "
             "list when A has none), built once per problem and timed on the first call (the fastest is kept)"
           : "cuDNN's graph API through the cuDNN frontend: NOT BUILT (" + graph_not_built + ")",
       "built with cuDNN and the cuDNN frontend headers; a forward bias/residual/activation/clip fused in the cuDNN "
       "graph in float16/bfloat16 NHWC, groups 1, C and K multiples of 8 (cuDNN's runtime-fusion engines); "
       "elsewhere the graph writes the convolution in float32 (float16/bfloat16: to a scratch buffer; float32: y) "
       "and GE2's epilogue kernel finishes y, rounded once; backward act none and even padding; strict float32 leaves out TF32 "
       "engines (FFT and Winograd ones stay, as with PyTorch's TF32 off); plans built by prepare() or the first call and timed on the first call (not during "
       "CUDA graph capture); the selector takes the next candidate when cuDNN has no engine for the problem; plan "
       "workspace <= 256 MiB"},
      {"cutlass_sm90", 35,
       cutlass_not_built.empty()
           ? "CUTLASS 3.x implicit GEMM for Hopper (sm_90a): x read by TMA in im2col mode and w by tiled TMA into "
             "a multi-stage shared-memory pipeline, wgmma with float32 accumulation (a producer warp, a consumer "
             "warpgroup), 128 x 128 output tiles of 64-channel steps (128 x 64 for 64 filters or fewer, with 4 "
             "stages, two CTAs per SM, for none/relu/leaky_relu; GE2_CUTLASS_SM90_CONV_TILE=128x128|128x64 forces "
             "one); for more than 64 filters with none/relu/leaky_relu, the same mainloop on CUTLASS's persistent "
             "ping-pong kernel in 64 x 128 tiles (GE2_CUTLASS_SM90_CONV_FPROP=conv|pingpong forces one); 1x1 "
             "convolutions at stride 1 without padding, for none/relu/leaky_relu, as GEMMs on that kernel in 128 x "
             "64 tiles (64 x 128 for more than 64 filters; GE2_CUTLASS_SM90_CONV_1X1=conv|gemm_128x64|gemm_64x128 "
             "forces the conv paths or a tile); both persistent kernels as programmatic dependent launches (their "
             "prologue under the previous kernel's tail; GE2_CUTLASS_SM90_PDL=0 turns that off); bias, residual, "
             "activation and clip fused "
             "through an epilogue visitor tree (the activation a run-time argument within one of two instantiated "
             "families: none/relu/leaky_relu and gelu/silu), y rounded once and written by TMA; backward: CUTLASS's "
             "dgrad (dy in im2col mode; 128 x 128 tiles, or 128 x 64 with 4 stages, two CTAs per SM, for 64 channels "
             "or fewer and reductions K*R*S <= 128; the forward's tile setting forces dgrad's too) and wgrad (64 x "
             "128 tiles) kernels, dbias by GE2's reduction; where wgrad has few output tiles for the SMs its N*P*Q "
             "reduction runs in slices (one grid layer each, as many as keep one wave of CTAs, fewer where the "
             "adding costs more; GE2_CUTLASS_SM90_WGRAD_SLICES=<n> forces a count) into a per-stream float32 "
             "workspace, added in order and rounded once by a second kernel"
           : "CUTLASS 3.x implicit GEMM for Hopper (sm_90a): NOT BUILT (" + cutlass_not_built + ")",
       "built with CUTLASS's headers; an sm_90 GPU; NHWC; float16 or bfloat16; groups 1; C and K multiples of 8; "
       "padding <= 128, (R-1)*dilation and (S-1)*dilation < 255, stride <= 8 (TMA im2col); backward act none and "
       "stride 1; every tensor 16-byte aligned (the selector takes the next candidate otherwise); tensors below "
       "2^31 elements",
       false, kVectorAlignment, {DType::Float16, DType::BFloat16}},
      {"implicit_gemm", 30,
       "GE2's own implicit GEMM on tensor cores, forward only: x gathered on the fly by 16-byte cp.async (padding, "
       "stride, dilation in the gather, zero-fill outside), w [K, R, S, C], 64-channel reduction tiles in a "
       "multi-stage shared-memory pipeline, ldmatrix + mma.sync m16n8k16 with float32 accumulation, bias, "
       "residual and activation fused into the epilogue, y written in 16-byte rows; no workspace. Backward runs on cudnn or "
       "im2col_gemm. Tile configs (chosen per problem; GE2_IMPLICIT_GEMM_CONFIG=<index> forces one): " +
           implicit_gemm_configs(),
       "forward only; NHWC; float16 or bfloat16; groups 1; C % 8 == 0; R, S <= 16; x and w 16-byte aligned "
       "(the selector takes the next candidate otherwise); N*P*Q, H*W*C and K*R*S*C below 2^30, N*H*W*C below 2^33; sm_80 or newer"},
      {"depthwise", 25,
       "GE2's direct depthwise convolution, forward only: the R x S taps of a channel accumulated in float32, bias, "
       "residual, activation and clip fused, y rounded once; no workspace. 16-bit NHWC, C % 8 == 0, 3x3 or 5x5 at "
       "stride 1 or 2: output tiles whose input window (halo included, up to 64 channels) is staged in shared memory by "
       "16-byte cp.async, a thread computing strips of 4 outputs of a channel pair from registers; other 16-bit "
       "NHWC with C % 8 == 0: a thread per 8 channels of a pixel (16-byte loads); else a thread per output",
       "forward only; groups == C == K (one filter per channel); NCHW or NHWC; float32, float16 or bfloat16; any "
       "alignment", false, kAnyAlignment},
      {"cudnn", 20,
       has_cudnn() ? "cuDNN's convolution (legacy C API): the algorithm cudnnFind* times fastest per problem, cached; "
                     "float32 bias/residual/activation by one in-place epilogue kernel; backward data and filter (dbias "
                     "by GE2's reduction)"
                   : "cuDNN's convolution: NOT BUILT (CMake found no cuDNN: neither in the CUDA toolkit nor in the "
                     "nvidia-cudnn-cu13 Python package)",
       "built with cuDNN; a forward epilogue (bias, residual, activation) in float32 only; backward act none; "
       "symmetric padding; tensors below "
       "2^31 elements; the first call of a problem runs cudnnFind* (not during CUDA graph capture); a call "
       "raises when cudnnFind* returns no working algorithm"},
      {"im2col_gemm", 10,
       "im2col into a per-stream workspace + one batched cuBLASLt GEMM (a batch per group) + one fused "
       "bias/residual/activation kernel; backward: dX by GEMM + col2im gather, dW by GEMM, dbias by a reduction",
       "none: every layout, stride, padding, dilation, groups, activation and dtype (the path that always works); "
       "workspace of C*R*S*N*P*Q elements plus a float32 K*N*P*Q accumulator", kFallback, kAnyAlignment},
      // the scaled_conv2d op's (FP8) kernel: cudnn_graph's graph with FP8 tensors, in this module to share it; its
      // own dtypes (FP8 x), whatever the conv2d rows' are
      {"cudnn_graph_fp8", 40,
       graph_not_built.empty()
           ? "scaled_conv2d on cuDNN's graph API: conv_fprop of FP8 x and w (float32 accumulation), dequantized by "
             "scale_x * scale_w, bias/residual/activation/clip as pointwise nodes in float32, an FP8 y's amax and "
             "scale_y in the same graph; plans as cudnn_graph's"
           : "scaled_conv2d on cuDNN's graph API: NOT BUILT (" + graph_not_built + ")",
       "built with cuDNN and the cuDNN frontend headers; sm_89+; NHWC, groups 1, C and K multiples of 16; x and w "
       "FP8; y float16, bfloat16 or FP8; bias y's dtype (bfloat16 for an FP8 y); a residual with a 16-bit y only; "
       "amax with an FP8 y only; 16-byte aligned tensors; declines at prepare() when cuDNN has no engine",
       false, kVectorAlignment, {DType::Float8E4M3, DType::Float8E5M2}},
  };
}

void check_shape(const Shape& s) {
  const int64_t sizes[] = {s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.p, s.q};
  for (int64_t size : sizes) {
    if (size < 1) throw std::invalid_argument("shape: every size (N, C, H, W, K, R, S, P, Q) must be >= 1");
  }
  if (s.stride_h < 1 || s.stride_w < 1) throw std::invalid_argument("stride: must be >= 1");
  if (s.dilation_h < 1 || s.dilation_w < 1) throw std::invalid_argument("dilation: must be >= 1");
  if (s.pad_top < 0 || s.pad_left < 0) throw std::invalid_argument("padding: must be >= 0");
  if (s.groups < 1 || s.c % s.groups != 0 || s.k % s.groups != 0) {
    throw std::invalid_argument("groups: must be >= 1 and divide C and K");
  }
  if (!is_floating(s.dtype)) throw std::invalid_argument("dtype: expected float32, float16 or bfloat16");
}

// ---- im2col_gemm forward ------------------------------------------------------------------------------------
std::size_t im2col_col_elements(const Shape& s) {
  return static_cast<std::size_t>(s.c * s.r * s.s) * static_cast<std::size_t>(s.n * s.p * s.q);
}

namespace {

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void im2col_gemm_accumulate(const Shape& s, const void* x, const void* w, void* col, float* acc, bool allow_tf32,
                            cudaStream_t stream) {
  launch_im2col(s, x, col, stream);
  const int64_t cg = s.c / s.groups, kg = s.k / s.groups, npq = s.n * s.p * s.q, rsc = cg * s.r * s.s;
  GemmCall call;
  call.batch = s.groups;
  call.dtype = s.dtype;
  call.c_dtype = DType::Float32;
  call.allow_tf32 = allow_tf32;
  call.c = acc;
  if (s.layout == Layout::NCHW) {
    // acc[g] (Kg x NPQ) = W[g] (Kg x CgRS) @ col[g] (CgRS x NPQ)
    call.a = w, call.lda = rsc, call.stride_a = kg * rsc;
    call.b = col, call.ldb = npq, call.stride_b = rsc * npq;
    call.ldc = npq, call.stride_c = kg * npq;
    call.m = kg, call.n = npq, call.k = rsc;
  } else {
    // acc (NPQ x K), group g in columns [g*Kg, (g+1)*Kg): col[g] (NPQ x RSCg) @ W[g]^T (RSCg x Kg)
    call.a = col, call.lda = rsc, call.stride_a = npq * rsc;
    call.b = w, call.ldb = rsc, call.stride_b = kg * rsc, call.trans_b = true;
    call.ldc = s.k, call.stride_c = kg;
    call.m = npq, call.n = kg, call.k = rsc;
  }
  batched_gemm(call, stream);
}

std::string unsupported_reason(Kernel kernel, const Shape& shape, const Epilogue& epilogue, bool backward) {
  if (kernel == Kernel::CudnnGraph) return cudnn_graph_unsupported_reason(shape, epilogue, backward);
  if (kernel == Kernel::Cudnn) return cudnn_unsupported_reason(shape, epilogue, backward);
  if (kernel == Kernel::ImplicitGemm) return implicit_gemm_unsupported_reason(shape, backward);
  if (kernel == Kernel::Depthwise) return depthwise_unsupported_reason(shape, backward);
  if (kernel == Kernel::CutlassSm90) return cutlass_sm90_unsupported_reason(shape, epilogue, backward);
  return "";
}

void require_supported(Kernel kernel, const Shape& shape, const Epilogue& epilogue, bool backward) {
  const std::string reason = unsupported_reason(kernel, shape, epilogue, backward);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

void throw_declined(Kernel kernel, const std::string& why) {
  throw std::runtime_error(std::string("ge2 op 'conv2d': kernel '") + kernel_name(kernel) + "': " + why);
}

void prepare(Kernel kernel, const Shape& shape, const Epilogue& epilogue, float slope, bool allow_tf32, bool backward) {
  check_shape(shape);
  if (kernel == Kernel::CudnnGraph) {
    require_supported(kernel, shape, epilogue, backward);
    cudnn_graph_prepare(shape, epilogue, slope, allow_tf32, backward);
  }
}

namespace {

void im2col_gemm_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  const std::size_t col_bytes = round_up(im2col_col_elements(s) * dtype_size(s.dtype));
  const std::size_t acc_bytes = round_up(static_cast<std::size_t>(s.k * s.n * s.p * s.q) * sizeof(float));
  char* scratch = static_cast<char*>(StreamWorkspace::get(col_bytes + acc_bytes, stream));
  float* acc = reinterpret_cast<float*>(scratch + col_bytes);
  im2col_gemm_accumulate(s, args.x, args.w, scratch, acc, args.allow_tf32, stream);
  launch_epilogue(args, acc, /*acc_in_y_layout=*/false, stream);
}

// Enqueues the forward on `kernel`: empty when it did, else why it declined at run time (enqueuing nothing).
std::string try_forward(Kernel kernel, const ForwardArgs& args, cudaStream_t stream) {
  switch (kernel) {
    case Kernel::CudnnGraph: return cudnn_graph_forward(args, stream);
    case Kernel::ImplicitGemm:
      if (!implicit_gemm_aligned(args)) {
        return "needs 16-byte aligned x and w (its cp.async vectors); got an offset view";
      }
      implicit_gemm_forward(args, stream);
      return "";
    case Kernel::CutlassSm90:
      if (!cutlass_sm90_aligned(args)) {
        return "needs 16-byte aligned x, w, y, bias and residual (TMA reads and writes 16-byte rows); got an offset "
               "view";
      }
      cutlass_sm90_forward(args, stream);
      return "";
    case Kernel::Cudnn: return cudnn_forward(args, stream) ? "" : "cudnnFind* returned no working algorithm";
    case Kernel::Depthwise: depthwise_forward(args, stream); return "";
    default: im2col_gemm_forward(args, stream); return "";
  }
}

}  // namespace

void forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_shape(args.shape);
  if (args.x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (args.w == nullptr) throw std::invalid_argument("w: null device pointer");
  if (args.y == nullptr) throw std::invalid_argument("y: null device pointer");
  require_supported(kernel, args.shape, epilogue_of(args), false);
  const std::string declined = try_forward(kernel, args, stream);
  if (declined.empty()) return;
  if (kernel == Kernel::ImplicitGemm) throw std::invalid_argument("x, w: kernel 'implicit_gemm' " + declined);
  if (kernel == Kernel::CutlassSm90) {
    throw std::invalid_argument("x, w, y, bias, residual: kernel 'cutlass_sm90' " + declined);
  }
  throw_declined(kernel, declined);
}

}  // namespace ge2::conv2d
