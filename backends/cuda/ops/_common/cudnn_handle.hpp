// cuDNN for an op's cuDNN candidates: status checks, one handle per device (created on first use, kept for the
// life of the process, like the cuBLASLt handle) and the refusal to set anything up during CUDA graph capture.
// A handle's stream is state of the handle, so every call that binds it and enqueues work holds call_mutex().
#pragma once
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>
#include <cudnn.h>

#include "status.hpp"

namespace ge2 {

inline void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("ge2 op '") + GE2_OP_NAME + "': " + what + " failed: " +
                             cudnnGetErrorString(status));
  }
}
#define GE2_CUDNN_CHECK(expr) ::ge2::check_cudnn((expr), #expr)

class CudnnHandles {
 public:
  static CudnnHandles& instance() {
    static auto* handles = new CudnnHandles();  // never destroyed: outlives Python's teardown order
    return *handles;
  }

  // Held by every call that binds a handle to its stream and enqueues work with it.
  std::mutex& call_mutex() { return call_mutex_; }

  // The current device's handle, on whatever stream it was last bound to (for work that enqueues nothing).
  cudnnHandle_t current() {
    const int device = current_device();
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = handles_.find(device);
    if (found != handles_.end()) return found->second;
    cudnnHandle_t handle = nullptr;
    GE2_CUDNN_CHECK(cudnnCreate(&handle));
    handles_.emplace(device, handle);
    return handle;
  }

  // The current device's handle, bound to `stream`.
  cudnnHandle_t bound_to(cudaStream_t stream) {
    cudnnHandle_t handle = current();
    GE2_CUDNN_CHECK(cudnnSetStream(handle, stream));
    return handle;
  }

 private:
  std::mutex mutex_;  // handles_
  std::mutex call_mutex_;
  std::map<int, cudnnHandle_t> handles_;
};

// cuDNN's algorithm searches and plan builds allocate and synchronize: `kernel` refuses them during capture.
inline void refuse_cudnn_setup_during_capture(cudaStream_t stream, const char* kernel, const char* setup) {
  if (stream_capturing(stream)) {
    throw std::runtime_error(std::string("ge2 op '") + GE2_OP_NAME + "': kernel '" + kernel + "' must " + setup +
                             " before CUDA graph capture; run the problem once on this stream first");
  }
}

}  // namespace ge2
