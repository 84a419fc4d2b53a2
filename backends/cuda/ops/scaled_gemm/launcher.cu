// scaled_gemm launcher: argument checks, cuBLASLt's FP8 rules, the plan cache and the call.
//
// Row-major Y[m, n] = A[m, k] @ B[n, k]^T is column-major Y^T[n, m] = B @ A^T, seen by cuBLASLt as D = op(A') @ B'
// with A' = our B (stored column-major k x n, op T) and B' = our A (column-major k x m, op N): the "TN" layout,
// the only one Hopper's FP8 matmul has. A' scale is therefore our scale_b and B' scale our scale_a.
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "api.hpp"
#include "cublaslt_cache.hpp"
#include "status.hpp"

namespace ge2::scaled_gemm {

std::vector<KernelInfo> kernel_table() {
  return {
      {"cublaslt_fp8", 30, "cuBLASLt FP8 matmul: per-tensor scales, bias/relu/gelu epilogue and the output's amax",
       "sm_89+; A [m, k] and B [n, k] (TN) in float8_e4m3fn or float8_e5m2, not both E5M2; an E5M2 output needs an "
       "E5M2 input; m, n, k multiples of 16; "
       "A, B, Y and bias 16-byte aligned; act in {none, relu, gelu}; bias bfloat16 for float32/FP8 outputs, else "
       "the output's dtype; scale_d with an FP8 output", false, kVectorAlignment},
  };
}

namespace {

bool aligned16(const void* pointer) { return lt_alignment(pointer) >= 16; }

cudaDataType_t lt_type(DType dtype) {
  switch (dtype) {
    case DType::Float8E4M3: return CUDA_R_8F_E4M3;
    case DType::Float8E5M2: return CUDA_R_8F_E5M2;
    default: return to_cuda_datatype(dtype);
  }
}

// cuBLASLt's C for an FP8 matmul: bfloat16 when D is FP8 (C is never FP8 on Hopper), else D's own type. beta is
// 0 and C's pointer null, so C is never read, but its layout must be one cuBLASLt accepts.
cudaDataType_t c_type(DType y_dtype) { return is_float8(y_dtype) ? CUDA_R_16BF : to_cuda_datatype(y_dtype); }

cublasLtEpilogue_t epilogue_of(Act act, bool bias) {
  switch (act) {
    case Act::None: return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    case Act::Relu: return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case Act::Gelu: return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    default: throw std::logic_error("scaled_gemm: activation has no cuBLASLt epilogue");
  }
}

void check_args(const ForwardArgs& args) {
  if (args.m < 1 || args.n < 1 || args.k < 1) {
    throw std::invalid_argument("m, n, k: every dimension must be >= 1, got " + std::to_string(args.m) + ", " +
                                std::to_string(args.n) + ", " + std::to_string(args.k));
  }
  if (!is_float8(args.a_dtype)) {
    throw std::invalid_argument(std::string("a dtype: expected float8_e4m3fn or float8_e5m2, got ") +
                                dtype_name(args.a_dtype));
  }
  if (!is_float8(args.b_dtype)) {
    throw std::invalid_argument(std::string("b dtype: expected float8_e4m3fn or float8_e5m2, got ") +
                                dtype_name(args.b_dtype));
  }
  if (!is_floating(args.y_dtype) && !is_float8(args.y_dtype)) {
    throw std::invalid_argument(std::string("out_dtype: expected bfloat16, float16, float32, float8_e4m3fn or "
                                            "float8_e5m2, got ") + dtype_name(args.y_dtype));
  }
  if (args.a == nullptr) throw std::invalid_argument("a: null device pointer");
  if (args.b == nullptr) throw std::invalid_argument("b: null device pointer");
  if (args.y == nullptr) throw std::invalid_argument("y: null device pointer");
  if (args.scale_a == nullptr) throw std::invalid_argument("scale_a: null device pointer");
  if (args.scale_b == nullptr) throw std::invalid_argument("scale_b: null device pointer");
  if (is_float8(args.y_dtype) && args.scale_d == nullptr) {
    throw std::invalid_argument("scale_d: an FP8 output needs its scale (a float32 device scalar)");
  }
}

// ---- cuBLASLt plan cache -------------------------------------------------------------------------------------
// One plan per problem: descriptor, layouts and the heuristic's algorithms; pointers are set per call. A plan is
// made with cuBLASLt computing the amax (AMAX_D_POINTER) first; when cuBLASLt has no algorithm that does for the
// problem (it documents the amax for FP8 outputs), a second plan without it runs and amax.cu computes the amax.
using PlanKey = std::array<int64_t, 16>;

struct LtPlan : LtMatmulPlan {
  cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;
};

std::mutex plan_cache_mutex;
std::map<PlanKey, std::unique_ptr<LtPlan>>& plan_cache() {
  static auto* cache = new std::map<PlanKey, std::unique_ptr<LtPlan>>();  // never destroyed: see LtResources
  return *cache;
}

template <typename T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value,
                   const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), GE2_OP_NAME, what);
}

void set_pointers(LtPlan& plan, const ForwardArgs& args, bool lt_amax) {
  // cuBLASLt's A is our B and its B our A (see the top of this file).
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, args.scale_b, "set A_SCALE_POINTER (scale_b)");
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, args.scale_a, "set B_SCALE_POINTER (scale_a)");
  if (is_float8(args.y_dtype)) {
    set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, args.scale_d, "set D_SCALE_POINTER (scale_d)");
  }
  if (lt_amax) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, args.amax, "set AMAX_D_POINTER");
  if (args.bias != nullptr) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, args.bias, "set BIAS_POINTER");
}

LtPlan* find_or_create_plan(const ForwardArgs& args, bool lt_amax, int device) {
  const PlanKey key = {device, args.m, args.n, args.k, static_cast<int64_t>(args.a_dtype),
                       static_cast<int64_t>(args.b_dtype), static_cast<int64_t>(args.y_dtype),
                       args.bias != nullptr ? static_cast<int64_t>(args.bias_dtype) : -1,
                       static_cast<int64_t>(args.act), args.fast_accum, lt_amax,
                       lt_alignment(args.a),
                       lt_alignment(args.b),
                       lt_alignment(args.y),
                       lt_alignment(args.bias),
                       static_cast<int64_t>(kLtWorkspaceBytes)};
  std::lock_guard<std::mutex> lock(plan_cache_mutex);
  auto found = plan_cache().find(key);
  if (found != plan_cache().end()) return found->second.get();

  auto plan = std::make_unique<LtPlan>();
  GE2_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "set TRANSA");
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "set TRANSB");
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue_of(args.act, args.bias != nullptr),
                "set EPILOGUE");
  if (args.bias != nullptr) {
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(lt_type(args.bias_dtype)),
                  "set BIAS_DATA_TYPE");
  }
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(args.fast_accum ? 1 : 0),
                "set FAST_ACCUM");
  set_pointers(*plan, args, lt_amax);  // the heuristic reads the pointers' alignment
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_a, lt_type(args.b_dtype), args.k, args.n, args.k));
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_b, lt_type(args.a_dtype), args.k, args.m, args.k));
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_c, c_type(args.y_dtype), args.n, args.m, args.n));
  GE2_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_d, lt_type(args.y_dtype), args.n, args.m, args.n));

  cublasLtMatmulPreference_t preference = nullptr;
  GE2_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kLtWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof(workspace_bytes));
  // The pointers' actual alignment (cuBLASLt's A is our B, its B our A; C is D's pointer), so that no algorithm
  // returned assumes more than a call gives.
  const uint32_t alignments[] = {static_cast<uint32_t>(lt_alignment(args.b)),
                                 static_cast<uint32_t>(lt_alignment(args.a)),
                                 static_cast<uint32_t>(lt_alignment(args.y))};
  const cublasLtMatmulPreferenceAttributes_t alignment_attributes[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    cublasLtMatmulPreferenceSetAttribute(preference, alignment_attributes[i], &alignments[std::min(i, 2)],
                                         sizeof(uint32_t));
  }
  constexpr int kRequested = 8;  // several, so a failing algorithm can fall to the next
  cublasLtMatmulHeuristicResult_t results[kRequested] = {};
  int returned = 0;
  plan->heuristic_status = cublasLtMatmulAlgoGetHeuristic(
      LtResources::instance().handle(device), plan->desc, plan->layout_a, plan->layout_b, plan->layout_c,
      plan->layout_d, preference, kRequested, results, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (plan->heuristic_status == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->algorithms.push_back(results[i].algo);
    }
  }
  LtPlan* raw = plan.get();
  plan_cache().emplace(key, std::move(plan));
  return raw;
}

std::string problem_string(const ForwardArgs& args) {
  return "m=" + std::to_string(args.m) + " n=" + std::to_string(args.n) + " k=" + std::to_string(args.k) + " a=" +
         dtype_name(args.a_dtype) + " b=" + dtype_name(args.b_dtype) + " y=" + dtype_name(args.y_dtype) +
         (args.bias != nullptr ? std::string(" bias=") + dtype_name(args.bias_dtype) : std::string(" no bias")) +
         " act=" + std::to_string(static_cast<int>(args.act)) + (args.fast_accum ? " fast_accum" : "");
}

// Runs the plan's algorithms, the one that worked last first. Returns the last cuBLASLt status.
cublasStatus_t run_plan(LtPlan& plan, const ForwardArgs& args, bool lt_amax, int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(plan.mutex);
  if (plan.algorithms.empty()) {
    return plan.heuristic_status == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : plan.heuristic_status;
  }
  cublasLtHandle_t handle = LtResources::instance().handle(device);
  void* workspace = LtResources::instance().workspace(device, stream);
  set_pointers(plan, args, lt_amax);
  const float alpha = 1.0f, beta = 0.0f;
  // C = nullptr: beta is 0, and C == D would need C's layout to be D's, which an FP8 D's (bfloat16 C) is not
  // (cuBLASLt answers CUBLAS_STATUS_INVALID_VALUE; torch._scaled_mm passes nullptr too).
  const auto matmul = [&](const cublasLtMatmulAlgo_t& algorithm) {
    return cublasLtMatmul(handle, plan.desc, &alpha, args.b, plan.layout_a, args.a, plan.layout_b, &beta, nullptr,
                          plan.layout_c, args.y, plan.layout_d, &algorithm, workspace, kLtWorkspaceBytes, stream);
  };
  if (!plan.timed) time_lt_algorithms(plan, stream, matmul);
  cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
  for (std::size_t attempt = 0; attempt < plan.algorithms.size(); ++attempt) {
    const std::size_t index = (plan.working + attempt) % plan.algorithms.size();
    status = matmul(plan.algorithms[index]);
    if (status == CUBLAS_STATUS_SUCCESS) {
      plan.working = index;
      return status;
    }
    if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE) return status;
  }
  // No algorithm takes this problem (cuBLASLt refuses before it enqueues anything): remember it, so that later calls
  // (a captured plan's included) go straight to the alternative.
  plan.algorithms.clear();
  plan.heuristic_status = status;
  return status;
}

}  // namespace

std::size_t plan_count() {
  std::lock_guard<std::mutex> lock(plan_cache_mutex);
  return plan_cache().size();
}

std::string unsupported_reason(const ForwardArgs& args, bool has_bias, int major, int minor) {
  if (major * 10 + minor < 89) {
    return "FP8 tensor cores need compute capability 8.9 or newer, this GPU is " + std::to_string(major) + "." +
           std::to_string(minor);
  }
  if (args.a_dtype == DType::Float8E5M2 && args.b_dtype == DType::Float8E5M2) {
    return "cuBLASLt has no E5M2 x E5M2 matmul (one operand must be float8_e4m3fn)";
  }
  if (args.y_dtype == DType::Float8E5M2 && args.a_dtype == DType::Float8E4M3 && args.b_dtype == DType::Float8E4M3) {
    return "cuBLASLt writes an E5M2 output only from an E5M2 input (E4M3 x E4M3 gives float8_e4m3fn, bfloat16, "
           "float16 or float32)";
  }
  if (args.m % 16 != 0 || args.n % 16 != 0 || args.k % 16 != 0) {
    return "cuBLASLt's FP8 matmul needs m, n and k multiples of 16, got m=" + std::to_string(args.m) +
           " n=" + std::to_string(args.n) + " k=" + std::to_string(args.k);
  }
  if (!aligned16(args.a) || !aligned16(args.b) || !aligned16(args.y) || !aligned16(args.bias)) {
    return "cuBLASLt's FP8 matmul needs A, B, Y and bias 16-byte aligned";
  }
  if (args.act != Act::None && args.act != Act::Relu && args.act != Act::Gelu) {
    return "cuBLASLt has no epilogue for this activation (only none, relu, gelu)";
  }
  if (has_bias) {
    const DType expected = (args.y_dtype == DType::Float16) ? DType::Float16 : DType::BFloat16;
    if (args.bias_dtype != expected) {
      return std::string("cuBLASLt's FP8 matmul takes a ") + dtype_name(expected) + " bias with a " +
             dtype_name(args.y_dtype) + " output, got " + dtype_name(args.bias_dtype);
    }
  }
  return "";
}

std::string forward(const ForwardArgs& args, cudaStream_t stream) {
  check_args(args);
  const int device = current_device();
  int major = 0, minor = 0;
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const std::string reason = unsupported_reason(args, args.bias != nullptr, major, minor);
  if (!reason.empty()) throw std::invalid_argument("scaled_gemm: " + reason);

  if (args.amax == nullptr) {  // nobody reads the amax: the plain plan
    const cublasStatus_t status = run_plan(*find_or_create_plan(args, false, device), args, false, device, stream);
    if (status == CUBLAS_STATUS_SUCCESS) return "cublaslt (no amax)";
    throw std::runtime_error(std::string("ge2 op 'scaled_gemm': cuBLASLt FP8 matmul failed for ") +
                             problem_string(args) + ": " + cublas_status_name(status));
  }
  const cublasStatus_t with_amax = run_plan(*find_or_create_plan(args, true, device), args, true, device, stream);
  if (with_amax == CUBLAS_STATUS_SUCCESS) return "cublaslt";
  // An FP8 output's amax is taken before scale_d and the cast, which only cuBLASLt sees: no fallback for it.
  const cublasStatus_t without_amax = is_float8(args.y_dtype)
                                          ? with_amax
                                          : run_plan(*find_or_create_plan(args, false, device), args, false, device,
                                                     stream);
  if (!is_float8(args.y_dtype) && without_amax == CUBLAS_STATUS_SUCCESS) {
    launch_output_amax(args.y, args.y_dtype, args.m * args.n, args.amax, stream);
    return "cublaslt+amax_kernel";
  }
  throw std::runtime_error(std::string("ge2 op 'scaled_gemm': cuBLASLt FP8 matmul failed for ") +
                           problem_string(args) + ": with AMAX_D_POINTER " + cublas_status_name(with_amax) +
                           (is_float8(args.y_dtype) ? std::string()
                                                    : std::string(", without it ") + cublas_status_name(without_amax)));
}

}  // namespace ge2::scaled_gemm
