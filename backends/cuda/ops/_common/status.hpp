// Error handling for code that lives inside Python: nothing exits, everything throws.
//   std::invalid_argument -> ValueError (bad arguments, checked before any device work)
//   std::runtime_error    -> RuntimeError (CUDA / library failures, naming the op and the library's message)
#pragma once
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#ifndef GE2_OP_NAME
#define GE2_OP_NAME "runtime"
#endif

namespace ge2 {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* op, const char* what) {
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  throw std::runtime_error(std::string("ge2 op '") + op + "': " + what + " failed: " + cudaGetErrorName(status) +
                           " (" + cudaGetErrorString(status) + ")");
}

inline void check_cuda(cudaError_t status, const char* op, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, op, what);
}

inline int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), GE2_OP_NAME, "cudaGetDevice");
  return device;
}

// The compute capability of the current device (90 for sm_90), or -1 when there is none (a CPU-only machine): what
// a candidate built for one architecture (sm_90a) checks before it says it can run.
inline int current_compute_capability() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return major * 10 + minor;
}

// Whether `stream` is capturing a CUDA graph: allocation, synchronisation and algorithm timing must wait for a call
// outside capture.
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), GE2_OP_NAME, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace ge2

#define GE2_CUDA_CHECK(expr) ::ge2::check_cuda((expr), GE2_OP_NAME, #expr)
// After a kernel launch: reports bad launch configurations with the kernel's name.
#define GE2_CHECK_LAUNCH(kernel_name) ::ge2::check_cuda(cudaGetLastError(), GE2_OP_NAME, "launch of " kernel_name)
