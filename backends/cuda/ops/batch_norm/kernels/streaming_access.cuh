// Streaming (evict-first) loads and stores of kN consecutive elements, for the data a pass touches for the last
// time: the affine pass's inputs (the partial kernels read them before, with ordinary loads, so that they may still
// be in L2) and its output. One 16-byte access when kN = kPackSize<T>, a scalar when kN = 1.
// The same helpers as row_norm's (row_norm_kernels.hpp); a shared _common/streaming_access.hpp would serve both.
#pragma once
#include <cstring>
#include <type_traits>

#include "dtype.hpp"
#include "vector_access.hpp"

namespace ge2::batch_norm {

// Scalar 16-bit values go through the unsigned short overloads (asm volatile): the __half/__nv_bfloat16 overloads
// are non-volatile asm that the compiler may hoist out of a bounds check (see CONTRIBUTING.md).
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

// A pack's values as float32 and back; bfloat16 two at a time (one paired conversion per 32-bit word).
template <typename T, int kN>
__device__ __forceinline__ void unpack_floats(const Pack<T, kN>& pack, float* values) {
  if constexpr (kN % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      const float2 pair = __bfloat1622float2(__nv_bfloat162(pack.values[i], pack.values[i + 1]));
      values[i] = pair.x;
      values[i + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) values[i] = to_float(pack.values[i]);
  }
}

template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> pack_floats(const float* values) {
  Pack<T, kN> pack;
  if constexpr (kN % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(values[i], values[i + 1]);
      pack.values[i] = pair.x;
      pack.values[i + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) pack.values[i] = from_float<T>(values[i]);
  }
  return pack;
}

}  // namespace ge2::batch_norm
