// The math both kernel variants share, in float32. expf (not __expf): the kernels are bandwidth-bound, so the
// accurate exponential costs nothing, and float32 results stay within 1e-5 of the float64 reference.
#pragma once
#include <cstdint>

namespace ge2::swiglu {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 (132 SMs x 8 resident blocks of 256 threads); grid-stride loops do the rest.
constexpr int64_t kMaxBlocks = 132 * 8;

inline int blocks_for(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

__device__ __forceinline__ float swiglu_forward(float a, float b) { return a * sigmoid(a) * b; }

// d/da (a * s(a)) = s + a * s * (1 - s) = s * (1 + a * (1 - s)).
__device__ __forceinline__ void swiglu_backward(float dy, float a, float b, float& da, float& db) {
  const float s = sigmoid(a);
  db = dy * a * s;
  da = dy * b * s * (1.0f + a * (1.0f - s));
}

}  // namespace ge2::swiglu
