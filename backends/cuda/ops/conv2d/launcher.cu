// conv2d launcher: argument checks, the batched cuBLASLt GEMM (with its plan cache) and the im2col_gemm forward.
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "api.hpp"
#include "cublaslt_cache.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::conv2d {

Kernel kernel_from_name(const std::string& name) {
  if (name == "auto") return Kernel::Auto;
  if (name == "cudnn_graph") return Kernel::CudnnGraph;
  if (name == "cudnn") return Kernel::Cudnn;
  if (name == "im2col_gemm") return Kernel::Im2colGemm;
  if (name == "implicit_gemm") return Kernel::ImplicitGemm;
  throw std::invalid_argument("kernel: expected one of auto, cudnn_graph, implicit_gemm, cudnn, im2col_gemm, got '" +
                              name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::Auto: return "auto";
    case Kernel::CudnnGraph: return "cudnn_graph";
    case Kernel::Cudnn: return "cudnn";
    case Kernel::Im2colGemm: return "im2col_gemm";
    case Kernel::ImplicitGemm: return "implicit_gemm";
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
  return {
      {"cudnn_graph", 40,
       graph_not_built.empty()
           ? "cuDNN's graph API through the cuDNN frontend: conv_fprop with bias and activation fused as pointwise "
             "nodes, conv_dgrad, conv_wgrad (dbias by GE2's reduction); plans from heuristics mode A (the fallback "
             "list when A has none), built once per problem and timed on the first call (the fastest is kept)"
           : "cuDNN's graph API through the cuDNN frontend: NOT BUILT (" + graph_not_built + ")",
       "built with cuDNN and the cuDNN frontend headers; forward bias/activation only in float16/bfloat16, NHWC, "
       "groups 1, C and K multiples of 8; backward act none; strict float32 leaves out TF32, FFT and Winograd "
       "engines; plans built by prepare() or the first call and timed on the first call (not during CUDA graph "
       "capture); auto takes the next candidate when cuDNN has no engine for the problem; plan workspace <= 256 MiB"},
      {"implicit_gemm", 30,
       "GE2's own implicit GEMM on tensor cores, forward only: x gathered on the fly by 16-byte cp.async (padding, "
       "stride, dilation in the gather, zero-fill outside), w [K, R, S, C], a 4-stage shared-memory pipeline, "
       "ldmatrix + mma.sync m16n8k16 with float32 accumulation, bias and activation fused into the epilogue; "
       "no workspace. Backward runs on cudnn or im2col_gemm",
       "forward only; NHWC; float16 or bfloat16; groups 1; C % 8 == 0; x and w 16-byte aligned (auto falls back "
       "otherwise); N*P*Q, H*W*C and K*R*S*C below 2^30; sm_80 or newer"},
      {"cudnn", 20,
       has_cudnn() ? "cuDNN's convolution (legacy C API): the algorithm cudnnFind* times fastest per problem, cached; "
                     "backward data and filter (dbias by GE2's reduction)"
                   : "cuDNN's convolution: NOT BUILT (CMake found no cuDNN: neither in the CUDA toolkit nor in the "
                     "nvidia-cudnn-cu13 Python package)",
       "built with cuDNN; act none; forward without bias (backward takes one); symmetric padding; tensors below "
       "2^31 elements; the first call of a problem runs cudnnFind* (not during CUDA graph capture); auto falls back "
       "to im2col_gemm when cudnnFind* returns no working algorithm"},
      {"im2col_gemm", 10,
       "im2col into a per-stream workspace + one batched cuBLASLt GEMM (a batch per group) + one fused "
       "bias/activation kernel; backward: dX by GEMM + col2im gather, dW by GEMM, dbias by a reduction",
       "none: every layout, stride, padding, dilation, groups, activation and dtype (the path that always works); "
       "workspace of C*R*S*N*P*Q elements plus a float32 K*N*P*Q accumulator"},
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

// ---- batched cuBLASLt GEMM -----------------------------------------------------------------------------------
namespace {

int64_t alignment_of(const void* pointer, int64_t ld_bytes, int64_t stride_bytes) {
  auto address = static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(pointer));
  int64_t combined = address | ld_bytes | (stride_bytes == 0 ? 256 : stride_bytes) | 256;
  return combined & (~combined + 1);  // largest power of two dividing every offset cuBLASLt adds
}

using PlanKey = std::array<int64_t, 20>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algorithms;
  std::size_t working = 0;
  std::mutex mutex;

  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (auto layout : {layout_a, layout_b, layout_c}) {
      if (layout) cublasLtMatrixLayoutDestroy(layout);
    }
  }
};

std::mutex plan_cache_mutex;
std::map<PlanKey, std::unique_ptr<Plan>>& plan_cache() {
  static auto* cache = new std::map<PlanKey, std::unique_ptr<Plan>>();  // never destroyed: see LtResources
  return *cache;
}

cublasLtMatrixLayout_t make_layout(DType dtype, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, to_cuda_datatype(dtype), rows, cols, ld));
  const int32_t count = static_cast<int32_t>(batch);
  GE2_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                    sizeof(stride)));
  return layout;
}

// Row-major C = op(A) @ op(B) is column-major C^T = op(B)^T @ op(A)^T: cuBLASLt's "A" is our B and its "B" our A.
Plan* find_or_create_plan(const GemmCall& call, int device) {
  const int64_t in_size = static_cast<int64_t>(dtype_size(call.dtype));
  const int64_t out_size = static_cast<int64_t>(dtype_size(call.c_dtype));
  const int64_t align_a = alignment_of(call.a, call.lda * in_size, call.stride_a * in_size);
  const int64_t align_b = alignment_of(call.b, call.ldb * in_size, call.stride_b * in_size);
  const int64_t align_c = alignment_of(call.c, call.ldc * out_size, call.stride_c * out_size);
  const PlanKey key = {device, call.m, call.n, call.k, call.batch, call.lda, call.ldb, call.ldc, call.stride_a,
                       call.stride_b, call.stride_c, call.trans_a, call.trans_b, static_cast<int64_t>(call.dtype),
                       static_cast<int64_t>(call.c_dtype), call.allow_tf32, align_a, align_b, align_c, 0};
  std::lock_guard<std::mutex> lock(plan_cache_mutex);
  auto found = plan_cache().find(key);
  if (found != plan_cache().end()) return found->second.get();

  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = (call.dtype == DType::Float32 && call.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                        : CUBLAS_COMPUTE_32F;
  GE2_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  const cublasOperation_t op_lt_a = call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  GE2_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
  GE2_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));
  // Stored shapes, column-major: a row-major R x C matrix with leading dimension ld is a column-major C x R one.
  const int64_t b_rows = call.trans_b ? call.k : call.n, b_cols = call.trans_b ? call.n : call.k;
  const int64_t a_rows = call.trans_a ? call.m : call.k, a_cols = call.trans_a ? call.k : call.m;
  plan->layout_a = make_layout(call.dtype, b_rows, b_cols, call.ldb, call.batch, call.stride_b);
  plan->layout_b = make_layout(call.dtype, a_rows, a_cols, call.lda, call.batch, call.stride_a);
  plan->layout_c = make_layout(call.c_dtype, call.n, call.m, call.ldc, call.batch, call.stride_c);

  cublasLtMatmulPreference_t preference = nullptr;
  GE2_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kLtWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof(workspace_bytes));
  const uint32_t alignments[] = {static_cast<uint32_t>(align_b), static_cast<uint32_t>(align_a),
                                 static_cast<uint32_t>(align_c)};
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignments[0],
                                       sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alignments[1],
                                       sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignments[2],
                                       sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignments[2],
                                       sizeof(uint32_t));
  constexpr int kRequested = 8;  // several, so a failing algorithm can fall to the next
  cublasLtMatmulHeuristicResult_t results[kRequested] = {};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      LtResources::instance().handle(device), plan->desc, plan->layout_a, plan->layout_b, plan->layout_c,
      plan->layout_c, preference, kRequested, results, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
    check_cublas(status, GE2_OP_NAME, "cublasLtMatmulAlgoGetHeuristic");
  }
  for (int i = 0; i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->algorithms.push_back(results[i].algo);
  }
  Plan* raw = plan.get();
  plan_cache().emplace(key, std::move(plan));
  return raw;
}

}  // namespace

void gemm(const GemmCall& call, cudaStream_t stream) {
  const int device = current_device();
  Plan* plan = find_or_create_plan(call, device);
  if (plan->algorithms.empty()) {
    throw std::runtime_error("ge2 op 'conv2d': cuBLASLt returned no algorithm for a " + std::to_string(call.m) +
                             "x" + std::to_string(call.n) + "x" + std::to_string(call.k) + " GEMM (batch " +
                             std::to_string(call.batch) + ")");
  }
  cublasLtHandle_t handle = LtResources::instance().handle(device);
  void* workspace = LtResources::instance().workspace(device, stream);
  const float alpha = 1.0f, beta = 0.0f;
  std::lock_guard<std::mutex> lock(plan->mutex);
  for (std::size_t attempt = 0; attempt < plan->algorithms.size(); ++attempt) {
    const std::size_t index = (plan->working + attempt) % plan->algorithms.size();
    const cublasStatus_t status =
        cublasLtMatmul(handle, plan->desc, &alpha, call.b, plan->layout_a, call.a, plan->layout_b, &beta, call.c,
                       plan->layout_c, call.c, plan->layout_c, &plan->algorithms[index], workspace,
                       kLtWorkspaceBytes, stream);
    if (status == CUBLAS_STATUS_SUCCESS) {
      plan->working = index;
      return;
    }
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_cublas(status, GE2_OP_NAME, "cublasLtMatmul");
  }
  throw std::runtime_error("ge2 op 'conv2d': no cuBLASLt algorithm could run the GEMM");
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
  gemm(call, stream);
}

std::string unsupported_reason(Kernel kernel, const Shape& shape, Act act, bool has_bias, bool backward) {
  if (kernel == Kernel::CudnnGraph) return cudnn_graph_unsupported_reason(shape, act, has_bias, backward);
  if (kernel == Kernel::Cudnn) return cudnn_unsupported_reason(shape, act, has_bias, backward);
  if (kernel == Kernel::ImplicitGemm) return implicit_gemm_unsupported_reason(shape, backward);
  return "";
}

void require_supported(Kernel kernel, const Shape& shape, Act act, bool has_bias, bool backward) {
  const std::string reason = unsupported_reason(kernel, shape, act, has_bias, backward);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

void throw_declined(Kernel kernel, const std::string& why) {
  throw std::runtime_error(std::string("ge2 op 'conv2d': kernel '") + kernel_name(kernel) + "': " + why);
}

void prepare(Kernel kernel, const Shape& shape, Act act, float slope, bool has_bias, bool allow_tf32, bool backward) {
  check_shape(shape);
  if (kernel == Kernel::CudnnGraph) {
    require_supported(kernel, shape, act, has_bias, backward);
    cudnn_graph_prepare(shape, act, slope, has_bias, allow_tf32, backward);
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
  launch_epilogue(s, acc, args.bias, args.y, args.act, args.slope, stream);
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
    case Kernel::Cudnn: return cudnn_forward(args, stream) ? "" : "cudnnFind* returned no working algorithm";
    default: im2col_gemm_forward(args, stream); return "";
  }
}

}  // namespace

Kernel forward(const ForwardArgs& args, Kernel requested, cudaStream_t stream) {
  check_shape(args.shape);
  if (args.x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (args.w == nullptr) throw std::invalid_argument("w: null device pointer");
  if (args.y == nullptr) throw std::invalid_argument("y: null device pointer");
  const bool has_bias = args.bias != nullptr;
  if (requested != Kernel::Auto) {
    require_supported(requested, args.shape, args.act, has_bias, false);
    const std::string declined = try_forward(requested, args, stream);
    if (declined.empty()) return requested;
    if (requested == Kernel::ImplicitGemm) throw std::invalid_argument("x, w: kernel 'implicit_gemm' " + declined);
    throw_declined(requested, declined);
  }
  // auto: the kernel table's order, each where it applies and finds a way to run the problem.
  for (Kernel kernel : {Kernel::CudnnGraph, Kernel::ImplicitGemm, Kernel::Cudnn}) {
    if (unsupported_reason(kernel, args.shape, args.act, has_bias, false).empty() &&
        try_forward(kernel, args, stream).empty()) {
      return kernel;
    }
  }
  im2col_gemm_forward(args, stream);
  return Kernel::Im2colGemm;
}

}  // namespace ge2::conv2d
