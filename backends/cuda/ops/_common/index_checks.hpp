// Integer index arrays (class labels, embedding ids): int32/int64 dispatch, and out-of-range indices found on the
// device. Kernels never read out of bounds; they write NaN for the affected rows and record the smallest offending
// position in an 8-byte slot of device memory. A caller that wants an exception resets the slot before the launch
// and reads it back after (which synchronizes the stream); plan launches skip both and stay asynchronous.
//
// Encoding: 0 = no error, otherwise ~position (so atomicMax keeps the smallest position, whatever the order in
// which threads find them: the report is deterministic).
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "status.hpp"

namespace ge2 {

__device__ __forceinline__ void record_bad_index(unsigned long long* slot, int64_t position) {
  atomicMax(slot, ~static_cast<unsigned long long>(position));
}

inline void reset_index_error(unsigned long long* slot, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(slot, 0, sizeof(*slot), stream), GE2_OP_NAME, "cudaMemsetAsync(index error slot)");
}

struct IndexError {
  int64_t position = -1;  // -1: none
  int64_t value = 0;      // the offending index
};

// Waits for the stream, then returns the first bad position and its value (read from `indices`, an int32 or int64
// array on the device).
inline IndexError take_index_error(const unsigned long long* slot, const void* indices, DType index_dtype,
                                   cudaStream_t stream) {
  unsigned long long encoded = 0;
  check_cuda(cudaMemcpyAsync(&encoded, slot, sizeof(encoded), cudaMemcpyDeviceToHost, stream), GE2_OP_NAME,
             "cudaMemcpyAsync(index error slot)");
  check_cuda(cudaStreamSynchronize(stream), GE2_OP_NAME, "cudaStreamSynchronize(index check)");
  IndexError error;
  if (encoded == 0) return error;
  error.position = static_cast<int64_t>(~encoded);
  const std::size_t size = dtype_size(index_dtype);
  const auto* address = static_cast<const char*>(indices) + static_cast<std::size_t>(error.position) * size;
  if (index_dtype == DType::Int32) {
    int32_t value = 0;
    check_cuda(cudaMemcpy(&value, address, size, cudaMemcpyDeviceToHost), GE2_OP_NAME, "cudaMemcpy(bad index)");
    error.value = value;
  } else {
    check_cuda(cudaMemcpy(&error.value, address, size, cudaMemcpyDeviceToHost), GE2_OP_NAME,
               "cudaMemcpy(bad index)");
  }
  return error;
}

}  // namespace ge2

// Runs the statement with `index_t` bound to the storage type of an integer index dtype (int32 or int64).
#define GE2_DISPATCH_INDEX(dtype, argument, ...)                                                   \
  switch (dtype) {                                                                               \
    case ::ge2::DType::Int32: { using index_t = int32_t; __VA_ARGS__; break; }                   \
    case ::ge2::DType::Int64: { using index_t = int64_t; __VA_ARGS__; break; }                   \
    default:                                                                                     \
      throw std::invalid_argument(std::string(argument) + ": expected int32 or int64, got " +    \
                                  ::ge2::dtype_name(dtype));                                     \
  }
