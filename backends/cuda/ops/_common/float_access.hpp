// Moves between a storage type and float32 registers, kN consecutive elements at a time in one access of
// kN * sizeof(T) bytes: 16 when kN = kPackSize<T> (the address then 16-byte aligned), a plain scalar when kN = 1.
// Row kernels hold float32 values in register arrays; fully unrolled loops keep `values` out of local memory.
#pragma once

#include "dtype.hpp"
#include "vector_access.hpp"

namespace ge2 {

template <int kN, typename T>
__device__ __forceinline__ void load_floats(const T* source, float* values) {
  const Pack<T, kN> pack = load_pack<T, kN>(source);
#pragma unroll
  for (int i = 0; i < kN; ++i) values[i] = to_float(pack.values[i]);
}

template <int kN, typename T>
__device__ __forceinline__ void store_floats(T* destination, const float* values) {
  Pack<T, kN> pack;
#pragma unroll
  for (int i = 0; i < kN; ++i) pack.values[i] = from_float<T>(values[i]);
  store_pack<T, kN>(destination, pack);
}

}  // namespace ge2
