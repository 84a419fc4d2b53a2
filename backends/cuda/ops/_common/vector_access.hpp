// 16-byte vector loads and stores for bandwidth-bound kernels.
#pragma once
#include <cstdint>

namespace ge2 {

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T values[N];
};

// Elements per 16-byte access.
template <typename T>
inline constexpr int kPackSize = 16 / sizeof(T);

inline bool is_aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* pointer) {
  return *reinterpret_cast<const Pack<T, N>*>(pointer);
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* pointer, const Pack<T, N>& pack) {
  *reinterpret_cast<Pack<T, N>*>(pointer) = pack;
}

}  // namespace ge2
