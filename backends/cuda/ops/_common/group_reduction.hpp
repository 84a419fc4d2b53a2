// Reductions over aligned groups of kWidth lanes of one warp (kWidth a power of two, at most 32), for kernels that
// give a short row to a fraction of a warp (softmax, reduce). Xor shuffles with offsets below kWidth never leave
// the group, so each group gets its own result. Every lane of the warp must make the call (the mask is the whole
// warp), including lanes whose row lies past the end.
#pragma once

namespace ge2 {

template <int kWidth, typename Op>
__device__ __forceinline__ float group_reduce(float value, Op op) {
  static_assert(kWidth >= 1 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0, "kWidth: a power of two <= 32");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

}  // namespace ge2
