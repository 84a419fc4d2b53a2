// Delayed scaling's per-tensor state update (Transformer Engine's recipe, "max" over the history): one block per
// tensor state, a few hundred floats. Runs inside a captured training step, so the scale never leaves the device.
#include "api.hpp"
#include "status.hpp"

namespace ge2::quantize_fp8 {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    scale_update_kernel(const float* __restrict__ history, const float* __restrict__ scale,
                        const float* __restrict__ amax, float* __restrict__ new_history, float* __restrict__ new_scale,
                        float* __restrict__ new_scale_inv, int64_t length, float target) {
  __shared__ float partial[kThreads / 32];
  const float newest = *amax;
  const bool record = isfinite(newest);  // an overflowed step (inf/NaN amax) leaves the state as it was
  float largest = 0.0f;
  for (int64_t i = threadIdx.x; i < length; i += kThreads) {
    const float value = record ? (i == 0 ? newest : history[i - 1]) : history[i];
    new_history[i] = value;
    largest = fmaxf(largest, value);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  }
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = largest;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) largest = fmaxf(largest, partial[w]);
    // target = fp8_max / 2^margin; an all-zero history keeps the previous scale (nothing to scale by yet)
    const float updated = largest > 0.0f ? target / largest : *scale;
    const float chosen = isfinite(updated) && updated > 0.0f ? updated : *scale;
    *new_scale = chosen;
    *new_scale_inv = 1.0f / chosen;
  }
}

}  // namespace

void scale_update(const float* history, const float* scale, const float* amax, float* new_history, float* new_scale,
                  float* new_scale_inv, int64_t length, DType dtype, int margin, cudaStream_t stream) {
  if (!is_float8(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float8_e4m3fn or float8_e5m2, got ") + dtype_name(dtype));
  }
  if (length < 1) {
    throw std::invalid_argument("length: the amax history needs >= 1 entry, got " + std::to_string(length));
  }
  if (margin < 0) throw std::invalid_argument("margin: expected >= 0, got " + std::to_string(margin));
  for (const void* pointer : {static_cast<const void*>(history), static_cast<const void*>(scale),
                              static_cast<const void*>(amax), static_cast<const void*>(new_history),
                              static_cast<const void*>(new_scale), static_cast<const void*>(new_scale_inv)}) {
    if (pointer == nullptr) throw std::invalid_argument("history, scale, amax and the outputs: null device pointer");
  }
  const float target = ldexpf(float8_max(dtype), -margin);
  scale_update_kernel<<<1, kThreads, 0, stream>>>(history, scale, amax, new_history, new_scale, new_scale_inv, length,
                                                   target);
  GE2_CHECK_LAUNCH("fp8_scale_update");
}

}  // namespace ge2::quantize_fp8
