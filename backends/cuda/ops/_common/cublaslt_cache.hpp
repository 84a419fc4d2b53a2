// cuBLASLt handle (one per device) and workspace (one per device and stream), created on first use and kept for
// the life of the process: nothing is allocated in the steady state. The first call on a stream must not happen
// inside CUDA graph capture (the executor warms every plan up before it captures).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "dtype.hpp"
#include "status.hpp"

namespace ge2 {

// cuBLASLt has no status-to-string function of its own (that lives in libcublas, which ops need not link).
inline const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (library not initialized)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (resource allocation failed)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (an unsupported value or parameter)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH (feature absent on this GPU)";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR (GPU memory access failed)";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED (GPU program failed to execute)";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (functionality not supported)";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

inline void check_cublas(cublasStatus_t status, const char* op, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("ge2 op '") + op + "': " + what + " failed: " + cublas_status_name(status) +
                             " (code " + std::to_string(static_cast<int>(status)) + ")");
  }
}

// 32 MiB: what NVIDIA recommends for Hopper so that every cuBLASLt kernel is eligible.
constexpr std::size_t kLtWorkspaceBytes = 32u << 20;

class LtResources {
 public:
  static LtResources& instance() {
    static LtResources* resources = new LtResources();  // never destroyed: outlives Python's teardown order
    return *resources;
  }

  cublasLtHandle_t handle(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = handles_.find(device);
    if (found != handles_.end()) return found->second;
    cublasLtHandle_t handle = nullptr;
    check_cublas(cublasLtCreate(&handle), GE2_OP_NAME, "cublasLtCreate");
    handles_.emplace(device, handle);
    return handle;
  }

  void* workspace(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_pair(device, reinterpret_cast<std::uintptr_t>(stream));
    auto found = workspaces_.find(key);
    if (found != workspaces_.end()) return found->second;
    void* pointer = nullptr;
    check_cuda(cudaMalloc(&pointer, kLtWorkspaceBytes), GE2_OP_NAME, "cudaMalloc(cuBLASLt workspace)");
    workspaces_.emplace(key, pointer);
    return pointer;
  }

 private:
  std::mutex mutex_;
  std::map<int, cublasLtHandle_t> handles_;
  std::map<std::pair<int, std::uintptr_t>, void*> workspaces_;
};

// The largest power of two dividing a device address, at most 256 (what cuBLASLt's alignment preferences take);
// 256 for nullptr (an absent operand constrains nothing).
inline int64_t lt_alignment(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  if (address == 0) return 256;
  return static_cast<int64_t>(std::min<std::uintptr_t>(address & (~address + 1), 256));
}

// A cached cuBLASLt matmul: its descriptor, the four layouts and the heuristic's algorithms (an op keeps one per
// problem; pointers are set per call under `mutex`). Destroys its descriptors.
struct LtMatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr, layout_d = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algorithms;
  std::size_t working = 0;  // index of the algorithm that last ran
  bool timed = false;       // the algorithms have been timed on this problem (working: the fastest)
  std::mutex mutex;

  LtMatmulPlan() = default;
  LtMatmulPlan(const LtMatmulPlan&) = delete;
  LtMatmulPlan& operator=(const LtMatmulPlan&) = delete;
  ~LtMatmulPlan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (auto layout : {layout_a, layout_b, layout_c, layout_d}) {
      if (layout) cublasLtMatrixLayoutDestroy(layout);
    }
  }
};

inline cudaDataType_t to_cuda_datatype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return CUDA_R_32F;
    case DType::Float16: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    default: throw std::invalid_argument(std::string("cuBLASLt: unsupported dtype ") + dtype_name(dtype));
  }
}

// The heuristic's first choice is not always the fastest on the problem at hand (seen on the H100: a few percent at
// 4096^3 bf16). Once per plan (the caller holds its mutex), outside CUDA-graph capture: times each of `plan`'s
// algorithms, `run(algorithm)` enqueuing one matmul with it on `stream` (the median of 3 after a warm-up call; one
// that fails is skipped), and makes the fastest the working one. The caller's real call follows and writes the
// output; a matmul that reads its own output (C aliasing D with beta != 0) must not be timed.
template <typename Run>
void time_lt_algorithms(LtMatmulPlan& plan, cudaStream_t stream, Run run) {
  if (stream_capturing(stream)) return;
  plan.timed = true;
  if (plan.algorithms.size() < 2) return;
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), GE2_OP_NAME, "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), GE2_OP_NAME, "cudaEventCreate");
  float best_ms = 0.0f;
  bool found = false;
  for (std::size_t index = 0; index < plan.algorithms.size(); ++index) {
    if (run(plan.algorithms[index]) != CUBLAS_STATUS_SUCCESS) continue;  // this one cannot run here; others may
    float samples[3];
    for (float& sample : samples) {
      check_cuda(cudaEventRecord(start, stream), GE2_OP_NAME, "cudaEventRecord");
      run(plan.algorithms[index]);
      check_cuda(cudaEventRecord(stop, stream), GE2_OP_NAME, "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), GE2_OP_NAME, "cudaEventSynchronize");
      check_cuda(cudaEventElapsedTime(&sample, start, stop), GE2_OP_NAME, "cudaEventElapsedTime");
    }
    std::sort(samples, samples + 3);
    if (!found || samples[1] < best_ms) {
      best_ms = samples[1];
      plan.working = index;
      found = true;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace ge2

#define GE2_CUBLAS_CHECK(expr) ::ge2::check_cublas((expr), GE2_OP_NAME, #expr)
