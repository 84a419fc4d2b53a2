// gemm launcher: argument checks, the cuBLASLt plan cache, and the named kernel (cublaslt_epilogue,
// cublaslt_postkernel, cutlass_sm90 or tiled; the Python selector chooses, and turns the fused epilogue off for
// GE2_FORCE_NO_EPILOGUE=1). The backward (backward.cu) runs the same names but cutlass_sm90.
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "api.hpp"
#include "cublaslt_cache.hpp"
#include "cutlass_build.hpp"
#include "status.hpp"

namespace ge2::gemm {

Kernel kernel_from_name(const std::string& name) {
  if (name == "cublaslt_epilogue") return Kernel::LtEpilogue;
  if (name == "cublaslt_postkernel") return Kernel::LtPostKernel;
  if (name == "cutlass_sm90") return Kernel::CutlassSm90;
  if (name == "tiled") return Kernel::Tiled;
  throw std::invalid_argument(
      "kernel: expected one of cublaslt_epilogue, cublaslt_postkernel, cutlass_sm90, tiled, got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::LtEpilogue: return "cublaslt_epilogue";
    case Kernel::LtPostKernel: return "cublaslt_postkernel";
    case Kernel::CutlassSm90: return "cutlass_sm90";
    case Kernel::Tiled: return "tiled";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  return {
      {"cublaslt_epilogue", 30,
       "cuBLASLt matmul with bias and activation fused into its epilogue (backward: dbias as BGRAD on the dB "
       "matmul, a chained gelu as DGELU_BGRAD on the dA matmul)",
       "act in {none, relu, gelu}; the residual before the activation (residual_after_act only with act none); "
       "save_preact only with gelu and N % 8 == 0 (GELU_AUX; RELU_AUX saves a bit-mask, not the pre-activation); "
       "bias and pre-activation pointers 16-byte aligned; cuBLASLt must return an algorithm (backward: for each "
       "matmul with its epilogue)"},
      {"cublaslt_postkernel", 20,
       "cuBLASLt matmul + one fused bias/activation/residual kernel (backward: plain cuBLASLt matmuls, post-kernels "
       "for dbias and a chained activation)",
       "every act; any alignment; cuBLASLt must return an algorithm for the plain matmul (backward: for each)"},
      // Below the cuBLASLt candidates until the H200 has checked it (pin it by name: kernel="cutlass_sm90").
      {"cutlass_sm90", 15,
       cutlass_not_built_reason().empty()
           ? "CUTLASS 3.x warp-specialized persistent GEMM for Hopper (TMA loads, wgmma; ping-pong 64x128x64, "
             "cooperative 128x128x64, ping-pong 128x128x64 or cooperative 128x256x64 tiles, the last two also in "
             "2-CTA clusters with TMA multicast (without clusters: act none only), chosen per dtype and shape by its "
             "tile tables) with bias, residual (beta * C, before or after the activation), alpha and activation "
             "fused by an epilogue visitor tree, float32 accumulation"
           : "CUTLASS 3.x warp-specialized persistent GEMM for Hopper: NOT BUILT (" + cutlass_not_built_reason() +
                 ")",
       "built with CUTLASS; an sm_90 GPU; float16 or bfloat16; trans_a and trans_b false; act none, relu, gelu, "
       "gelu_erf or silu; no save_preact; K and N multiples of 8; 16-byte aligned pointers; no backward"},
      {"tiled", 10, "GE2's own shared-memory tiled kernel, no cuBLAS: the path that always works (backward too)",
       "none (slow: the reference path)", kFallback, kAnyAlignment},
  };
}

namespace {

bool aligned16(const void* pointer) { return lt_alignment(pointer) >= 16; }

void check_args(const ForwardArgs& args) {
  if (args.m < 1 || args.n < 1 || args.k < 1) {
    throw std::invalid_argument("m, n, k: every dimension must be >= 1, got " + std::to_string(args.m) + ", " +
                                std::to_string(args.n) + ", " + std::to_string(args.k));
  }
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  if (args.a == nullptr) throw std::invalid_argument("a: null device pointer");
  if (args.b == nullptr) throw std::invalid_argument("b: null device pointer");
  if (args.y == nullptr) throw std::invalid_argument("y: null device pointer");
  if (args.beta != 0.0f && args.c == nullptr) throw std::invalid_argument("c: beta != 0 needs a residual C");
}

// ---- cuBLASLt plan cache -------------------------------------------------------------------------------------
// One plan per problem: descriptors, layouts and the algorithms the heuristic returned. Pointers are not part of a
// plan (they are set per call), but their alignment is, because it decides which algorithms are valid.
using PlanKey = std::array<int64_t, 18>;

std::mutex plan_cache_mutex;
std::map<PlanKey, std::unique_ptr<LtMatmulPlan>>& plan_cache() {
  static auto* cache = new std::map<PlanKey, std::unique_ptr<LtMatmulPlan>>();  // never destroyed: see LtResources
  return *cache;
}

cublasLtEpilogue_t to_cublaslt(LtEpilogue epilogue) {
  switch (epilogue) {
    case LtEpilogue::Default: return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case LtEpilogue::ReluBias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case LtEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case LtEpilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case LtEpilogue::GeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::BiasGradA: return CUBLASLT_EPILOGUE_BGRADA;
    case LtEpilogue::BiasGradB: return CUBLASLT_EPILOGUE_BGRADB;
    case LtEpilogue::GeluGradBiasGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_aux(LtEpilogue e) {
  return e == LtEpilogue::GeluAux || e == LtEpilogue::GeluAuxBias || e == LtEpilogue::GeluGradBiasGrad;
}
bool uses_bias(LtEpilogue e) {
  return e == LtEpilogue::Bias || e == LtEpilogue::ReluBias || e == LtEpilogue::GeluBias ||
         e == LtEpilogue::GeluAuxBias || e == LtEpilogue::BiasGradA || e == LtEpilogue::BiasGradB ||
         e == LtEpilogue::GeluGradBiasGrad;
}

// Row-major D = op(A) @ op(B) is column-major D^T = op(B)^T @ op(A)^T: cuBLASLt sees B as its "A" and A as its
// "B", with m and n swapped. Bias per output column of D is then per row of cuBLASLt's D, as cuBLASLt wants.
LtMatmulPlan* find_or_create_plan(const LtCall& call, int device) {
  const bool has_c = call.beta != 0.0f;
  const PlanKey key = {device, call.m, call.n, call.k, static_cast<int64_t>(call.dtype), call.trans_a, call.trans_b,
                       static_cast<int64_t>(call.epilogue), call.allow_tf32, has_c,
                       lt_alignment(call.a),
                       lt_alignment(call.b),
                       lt_alignment(has_c ? call.c : call.d),
                       lt_alignment(call.d),
                       lt_alignment(call.bias),
                       lt_alignment(call.aux),
                       static_cast<int64_t>(kLtWorkspaceBytes), 0};
  std::lock_guard<std::mutex> lock(plan_cache_mutex);
  auto found = plan_cache().find(key);
  if (found != plan_cache().end()) return found->second.get();

  auto plan = std::make_unique<LtMatmulPlan>();
  const cudaDataType_t type = to_cuda_datatype(call.dtype);
  const cublasComputeType_t compute = (call.dtype == DType::Float32 && call.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                        : CUBLAS_COMPUTE_32F;
  GE2_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  const cublasOperation_t op_lt_a = call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t op_lt_b = call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  GE2_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
  GE2_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));
  const cublasLtEpilogue_t epilogue = to_cublaslt(call.epilogue);
  GE2_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (uses_aux(call.epilogue)) {
    const int64_t aux_ld = call.n;
    GE2_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  }
  // Stored (pre-op) shapes, column-major: our row-major R x C matrix is a column-major C x R one.
  const int64_t a_rows = call.trans_a ? call.m : call.k, a_cols = call.trans_a ? call.k : call.m;
  const int64_t b_rows = call.trans_b ? call.k : call.n, b_cols = call.trans_b ? call.n : call.k;
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_a, type, b_rows, b_cols, b_rows));  // cuBLASLt A = B
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_b, type, a_rows, a_cols, a_rows));  // cuBLASLt B = A
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_c, type, call.n, call.m, call.n));
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_d, type, call.n, call.m, call.n));

  // The heuristic reads the epilogue pointers' alignment, so they are set before asking.
  if (uses_bias(call.epilogue)) {
    GE2_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof(call.bias)));
  }
  if (uses_aux(call.epilogue)) {
    GE2_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux,
                                                    sizeof(call.aux)));
  }
  cublasLtMatmulPreference_t preference = nullptr;
  GE2_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kLtWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof(workspace_bytes));
  const uint32_t align_a = static_cast<uint32_t>(key[11]), align_b = static_cast<uint32_t>(key[10]);
  const uint32_t align_c = static_cast<uint32_t>(key[12]), align_d = static_cast<uint32_t>(key[13]);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                       sizeof(align_d));
  constexpr int kRequested = 8;  // several, so a failing algorithm can fall to the next
  cublasLtMatmulHeuristicResult_t results[kRequested] = {};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      LtResources::instance().handle(device), plan->desc, plan->layout_a, plan->layout_b, plan->layout_c,
      plan->layout_d, preference, kRequested, results, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
    check_cublas(status, GE2_OP_NAME, "cublasLtMatmulAlgoGetHeuristic");
  }
  for (int i = 0; i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->algorithms.push_back(results[i].algo);
  }
  LtMatmulPlan* raw = plan.get();
  plan_cache().emplace(key, std::move(plan));
  return raw;
}

}  // namespace

std::size_t lt_plan_count() {
  std::lock_guard<std::mutex> lock(plan_cache_mutex);
  return plan_cache().size();
}

bool lt_has_algorithm(const LtCall& call) { return !find_or_create_plan(call, current_device())->algorithms.empty(); }

bool lt_matmul(const LtCall& call, cudaStream_t stream) {
  const int device = current_device();
  LtMatmulPlan* plan = find_or_create_plan(call, device);
  if (plan->algorithms.empty()) return false;
  cublasLtHandle_t handle = LtResources::instance().handle(device);
  void* workspace = LtResources::instance().workspace(device, stream);

  std::lock_guard<std::mutex> lock(plan->mutex);
  if (uses_bias(call.epilogue)) {
    GE2_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof(call.bias)));
  }
  if (uses_aux(call.epilogue)) {
    GE2_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux,
                                                    sizeof(call.aux)));
  }
  const void* c = call.beta != 0.0f ? call.c : call.d;
  if (!plan->timed && !(call.beta != 0.0f && call.c == call.d)) {
    time_lt_algorithms(*plan, stream, [&](const cublasLtMatmulAlgo_t& algorithm) {
      return cublasLtMatmul(handle, plan->desc, &call.alpha, call.b, plan->layout_a, call.a, plan->layout_b,
                            &call.beta, c, plan->layout_c, call.d, plan->layout_d, &algorithm, workspace,
                            kLtWorkspaceBytes, stream);
    });
  }
  // Try the algorithm that worked last, then the others; NOT_SUPPORTED means "try the next one".
  for (std::size_t attempt = 0; attempt < plan->algorithms.size(); ++attempt) {
    const std::size_t index = (plan->working + attempt) % plan->algorithms.size();
    const cublasStatus_t status =
        cublasLtMatmul(handle, plan->desc, &call.alpha, call.b, plan->layout_a, call.a, plan->layout_b, &call.beta, c,
                       plan->layout_c, call.d, plan->layout_d, &plan->algorithms[index], workspace,
                       kLtWorkspaceBytes, stream);
    if (status == CUBLAS_STATUS_SUCCESS) {
      plan->working = index;
      return true;
    }
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_cublas(status, GE2_OP_NAME, "cublasLtMatmul");
  }
  return false;
}

LtCall lt_call_for(const ForwardArgs& args) {
  LtCall call;
  call.a = args.a;
  call.b = args.b;
  call.d = args.y;
  call.m = args.m;
  call.n = args.n;
  call.k = args.k;
  call.dtype = args.dtype;
  call.trans_a = args.trans_a;
  call.trans_b = args.trans_b;
  call.alpha = args.alpha;
  call.allow_tf32 = args.allow_tf32;
  return call;
}

std::string unsupported_reason(Kernel kernel, const ForwardArgs& args, bool pointers_aligned) {
  if (kernel == Kernel::CutlassSm90) return cutlass_sm90_unsupported_reason(args, pointers_aligned);
  if (kernel != Kernel::LtEpilogue) return "";
  if (args.act != Act::None && args.act != Act::Relu && args.act != Act::Gelu) {
    return "cuBLASLt has no epilogue for this activation (only none, relu, gelu)";
  }
  if (args.residual_after_act && args.c != nullptr && args.act != Act::None) {
    return "residual_after_act: cuBLASLt adds C before its epilogue's activation";
  }
  if (args.preact != nullptr && args.act == Act::Relu) {
    return "save_preact with relu: RELU_AUX saves a bit-mask, not the pre-activation";
  }
  if (args.preact != nullptr && args.act == Act::Gelu && args.n % 8 != 0) {
    return "save_preact with gelu needs N % 8 == 0 (GELU_AUX leading dimension), got N = " + std::to_string(args.n);
  }
  if (!pointers_aligned) return "bias or pre-activation pointer is not 16-byte aligned";
  return "";
}

namespace {

LtEpilogue forward_epilogue(const ForwardArgs& args) {
  const bool bias = args.bias != nullptr;
  switch (args.act) {
    case Act::None: return bias ? LtEpilogue::Bias : LtEpilogue::Default;
    case Act::Relu: return bias ? LtEpilogue::ReluBias : LtEpilogue::Relu;
    case Act::Gelu:
      if (args.preact != nullptr) return bias ? LtEpilogue::GeluAuxBias : LtEpilogue::GeluAux;
      return bias ? LtEpilogue::GeluBias : LtEpilogue::Gelu;
    default: throw std::logic_error("forward_epilogue: activation has no cuBLASLt epilogue");
  }
}

bool run_epilogue(const ForwardArgs& args, cudaStream_t stream) {
  LtCall call = lt_call_for(args);
  call.c = args.c;
  call.beta = args.c != nullptr ? args.beta : 0.0f;
  call.bias = args.bias;
  call.aux = args.preact;
  call.epilogue = forward_epilogue(args);
  return lt_matmul(call, stream);
}

// alpha * A @ B into the pre-activation buffer (or Y), then bias, residual and activation in one pass.
bool run_postkernel(const ForwardArgs& args, cudaStream_t stream) {
  LtCall call = lt_call_for(args);
  void* accumulator = args.preact != nullptr ? args.preact : args.y;
  call.d = accumulator;
  if (!lt_matmul(call, stream)) return false;
  launch_postkernel(accumulator, args.c, args.bias, args.y, args.preact, args.m, args.n, args.dtype,
                    args.c != nullptr ? args.beta : 0.0f, args.residual_after_act, args.act, args.slope, stream);
  return true;
}

bool run(Kernel kernel, const ForwardArgs& args, cudaStream_t stream) {
  switch (kernel) {
    case Kernel::LtEpilogue: return run_epilogue(args, stream);
    case Kernel::LtPostKernel: return run_postkernel(args, stream);
    case Kernel::CutlassSm90: launch_cutlass_sm90(args, stream); return true;
    case Kernel::Tiled: launch_tiled(args, stream); return true;
  }
  throw std::logic_error("run: unknown kernel");
}

}  // namespace

Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_args(args);
  bool aligned = aligned16(args.bias) && aligned16(args.preact);
  if (kernel == Kernel::CutlassSm90) {  // TMA reads every operand in 16-byte rows
    aligned = aligned && aligned16(args.a) && aligned16(args.b) && aligned16(args.c) && aligned16(args.y);
  }
  const std::string reason = unsupported_reason(kernel, args, aligned);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
  if (!run(kernel, args, stream)) {
    throw std::runtime_error(std::string("ge2 op 'gemm': kernel '") + kernel_name(kernel) +
                             "': cuBLASLt returned no algorithm for this problem");
  }
  return kernel;
}

}  // namespace ge2::gemm
