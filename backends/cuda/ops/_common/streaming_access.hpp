// Streaming (evict-first) loads and stores of kN consecutive elements, for data a kernel touches for the last time
// (row_norm's rows and outputs): one 16-byte access when kN = kPackSize<T>, a scalar when kN = 1.
#pragma once
#include <cstring>

#include "dtype.hpp"
#include "vector_access.hpp"

namespace ge2 {

// Scalar 16-bit values go through the unsigned short overloads (asm volatile): the __half/__nv_bfloat16 overloads
// are non-volatile asm that the compiler may hoist out of a bounds check (CONTRIBUTING.md; it happened in row_norm).
template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> load_streaming(const T* pointer) {
  Pack<T, kN> pack;
  if constexpr (kN == 1 && sizeof(T) == 2) {
    const unsigned short raw = __ldcs(reinterpret_cast<const unsigned short*>(pointer));
    memcpy(&pack, &raw, sizeof(raw));
  } else if constexpr (kN == 1) {
    pack.values[0] = __ldcs(pointer);
  } else {
    static_assert(sizeof(Pack<T, kN>) == 16, "vector accesses are 16 bytes");
    const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(pointer));
    memcpy(&pack, &raw, sizeof(raw));
  }
  return pack;
}

template <typename T, int kN>
__device__ __forceinline__ void store_streaming(T* pointer, const Pack<T, kN>& pack) {
  if constexpr (kN == 1 && sizeof(T) == 2) {
    unsigned short raw;
    memcpy(&raw, &pack, sizeof(raw));
    __stcs(reinterpret_cast<unsigned short*>(pointer), raw);
  } else if constexpr (kN == 1) {
    __stcs(pointer, pack.values[0]);
  } else {
    static_assert(sizeof(Pack<T, kN>) == 16, "vector accesses are 16 bytes");
    uint4 raw;
    memcpy(&raw, &pack, sizeof(raw));
    __stcs(reinterpret_cast<uint4*>(pointer), raw);
  }
}

}  // namespace ge2
