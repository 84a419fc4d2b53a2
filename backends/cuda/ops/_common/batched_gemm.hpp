// Row-major batched GEMM on cuBLASLt: C_b = alpha * op(A_b) @ op(B_b) + beta * C_b, float32 accumulation, with a
// plan cache (descriptors, layouts and the heuristic's algorithms per shape and alignment) so that a steady-state
// call only enqueues. Nothing here allocates device memory beyond LtResources' handle and workspace, so a call is
// capturable in a CUDA graph once the stream's cuBLASLt workspace exists.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cublaslt_cache.hpp"
#include "dtype.hpp"
#include "status.hpp"

namespace ge2 {

// A/B are of `dtype`; C is `c_dtype` (float32 or `dtype`). Leading dimensions and batch strides in elements; op(A)
// is m x k, op(B) is k x n, C is m x n. allow_tf32 only matters for float32 A/B.
struct GemmCall {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  bool trans_a = false, trans_b = false;
  DType dtype = DType::Float32, c_dtype = DType::Float32;
  bool allow_tf32 = false;
  float alpha = 1.0f, beta = 0.0f;
};

namespace batched_gemm_detail {

inline int64_t alignment_of(const void* pointer, int64_t ld_bytes, int64_t stride_bytes) {
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

struct PlanCache {
  std::mutex mutex;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  static PlanCache& instance() {
    static auto* cache = new PlanCache();  // never destroyed: see LtResources
    return *cache;
  }
};

inline cublasLtMatrixLayout_t make_layout(DType dtype, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
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
inline Plan* find_or_create_plan(const GemmCall& call, int device) {
  const int64_t in_size = static_cast<int64_t>(dtype_size(call.dtype));
  const int64_t out_size = static_cast<int64_t>(dtype_size(call.c_dtype));
  const int64_t align_a = alignment_of(call.a, call.lda * in_size, call.stride_a * in_size);
  const int64_t align_b = alignment_of(call.b, call.ldb * in_size, call.stride_b * in_size);
  const int64_t align_c = alignment_of(call.c, call.ldc * out_size, call.stride_c * out_size);
  const PlanKey key = {device, call.m, call.n, call.k, call.batch, call.lda, call.ldb, call.ldc, call.stride_a,
                       call.stride_b, call.stride_c, call.trans_a, call.trans_b, static_cast<int64_t>(call.dtype),
                       static_cast<int64_t>(call.c_dtype), call.allow_tf32, align_a, align_b, align_c, 0};
  PlanCache& cache = PlanCache::instance();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto found = cache.plans.find(key);
  if (found != cache.plans.end()) return found->second.get();

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
  cache.plans.emplace(key, std::move(plan));
  return raw;
}

}  // namespace batched_gemm_detail

// Enqueues the GEMM on `stream`, trying the heuristic's algorithms in turn until one runs; throws std::runtime_error
// naming the op when none can.
inline void batched_gemm(const GemmCall& call, cudaStream_t stream) {
  const int device = current_device();
  batched_gemm_detail::Plan* plan = batched_gemm_detail::find_or_create_plan(call, device);
  auto shape = [&call] {
    return std::to_string(call.m) + "x" + std::to_string(call.n) + "x" + std::to_string(call.k) + " GEMM (batch " +
           std::to_string(call.batch) + ")";
  };
  if (plan->algorithms.empty()) {
    throw std::runtime_error(std::string("ge2 op '") + GE2_OP_NAME + "': cuBLASLt returned no algorithm for a " +
                             shape());
  }
  cublasLtHandle_t handle = LtResources::instance().handle(device);
  void* workspace = LtResources::instance().workspace(device, stream);
  std::lock_guard<std::mutex> lock(plan->mutex);
  for (std::size_t attempt = 0; attempt < plan->algorithms.size(); ++attempt) {
    const std::size_t index = (plan->working + attempt) % plan->algorithms.size();
    const cublasStatus_t status =
        cublasLtMatmul(handle, plan->desc, &call.alpha, call.b, plan->layout_a, call.a, plan->layout_b, &call.beta,
                       call.c, plan->layout_c, call.c, plan->layout_c, &plan->algorithms[index], workspace,
                       kLtWorkspaceBytes, stream);
    if (status == CUBLAS_STATUS_SUCCESS) {
      plan->working = index;
      return;
    }
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_cublas(status, GE2_OP_NAME, "cublasLtMatmul");
  }
  throw std::runtime_error(std::string("ge2 op '") + GE2_OP_NAME + "': no cuBLASLt algorithm could run the " + shape());
}

}  // namespace ge2
