// Asynchronous 16-byte copies global -> shared (sm_80+ cp.async), for kernels that stage tiles in shared memory.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace ge2 {

__device__ __forceinline__ unsigned smem_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global (a generic address) -> shared; with `valid` false it reads nothing and writes zeros (src must still
// be a mapped address). ThroughL1 (.ca) keeps the line in L1, for gathers that read nearly the same lines again (a
// conv's consecutive taps); .cg bypasses L1.
template <bool ThroughL1 = false>
__device__ __forceinline__ void cp_async_16(unsigned dst, uint64_t src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  if constexpr (ThroughL1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most Pending committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// Waits for every copy this thread issued, committed or not.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

}  // namespace ge2
