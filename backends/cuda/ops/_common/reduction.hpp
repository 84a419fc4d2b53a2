// Warp and block reductions in float32 for row-wise kernels (softmax, norms, cross-entropy, reduce).
#pragma once
#include <cfloat>

namespace ge2 {

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float identity() { return 0.0f; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float identity() { return -FLT_MAX; }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Every thread of the block gets the result. `scratch` holds 32 floats; the block size is a multiple of 32.
// Safe to call repeatedly with the same scratch: the trailing barrier keeps the next call from overwriting it early.
template <typename Op>
__device__ __forceinline__ float block_reduce(float value, Op op, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_reduce(value, op);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < warps ? scratch[lane] : Op::identity();
  value = warp_reduce(value, op);
  __syncthreads();
  return value;
}

}  // namespace ge2
