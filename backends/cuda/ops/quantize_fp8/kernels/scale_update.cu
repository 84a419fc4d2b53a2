// Delayed scaling's per-tensor state update (Transformer Engine's recipe, "max" over the history): one block per
// tensor state, a few hundred floats, every state of a training step in as few launches as the kernel's parameter
// space allows (kStatesPerLaunch). Runs inside a captured training step, so the scale never leaves the device.
#include <algorithm>
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::quantize_fp8 {
namespace {

constexpr int kThreads = 128;

// The states of one launch, by value: kernel parameters, so a captured step holds no table to keep alive.
struct ScaleStates {
  ScaleState state[kStatesPerLaunch];
};
static_assert(sizeof(ScaleStates) + sizeof(float) <= 4096, "kernel parameters are limited to 4 KB");

__global__ void __launch_bounds__(kThreads) scale_update_kernel(const ScaleStates states, float target) {
  __shared__ float partial[kThreads / 32];
  const ScaleState& s = states.state[blockIdx.x];
  const float newest = *s.amax;
  const bool record = isfinite(newest);  // an overflowed step (inf/NaN amax) leaves the state as it was
  float largest = 0.0f;
  for (int64_t i = threadIdx.x; i < s.length; i += kThreads) {
    const float value = record ? (i == 0 ? newest : s.history[i - 1]) : s.history[i];
    s.new_history[i] = value;
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
    const float updated = largest > 0.0f ? target / largest : *s.scale;
    const float chosen = isfinite(updated) && updated > 0.0f ? updated : *s.scale;
    *s.new_scale = chosen;
    *s.new_scale_inv = 1.0f / chosen;
  }
}

}  // namespace

void scale_update(const std::vector<ScaleState>& states, DType dtype, int margin, cudaStream_t stream) {
  if (!is_float8(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float8_e4m3fn or float8_e5m2, got ") + dtype_name(dtype));
  }
  if (margin < 0) throw std::invalid_argument("margin: expected >= 0, got " + std::to_string(margin));
  for (std::size_t index = 0; index < states.size(); ++index) {
    const ScaleState& s = states[index];
    const std::string where = "states[" + std::to_string(index) + "]: ";
    if (s.length < 1) {
      throw std::invalid_argument(where + "the amax history needs >= 1 entry, got length " +
                                  std::to_string(s.length));
    }
    for (const void* pointer : {static_cast<const void*>(s.history), static_cast<const void*>(s.scale),
                                static_cast<const void*>(s.amax), static_cast<const void*>(s.new_history),
                                static_cast<const void*>(s.new_scale), static_cast<const void*>(s.new_scale_inv)}) {
      if (pointer == nullptr) {
        throw std::invalid_argument(where + "history, scale, amax and the outputs: null device pointer");
      }
    }
  }
  const float target = ldexpf(float8_max(dtype), -margin);
  for (std::size_t first = 0; first < states.size(); first += kStatesPerLaunch) {
    const std::size_t count = std::min<std::size_t>(kStatesPerLaunch, states.size() - first);
    ScaleStates chunk{};
    std::copy_n(states.begin() + static_cast<std::ptrdiff_t>(first), count, chunk.state);
    scale_update_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(chunk, target);
    GE2_CHECK_LAUNCH("fp8_scale_update");
  }
}

}  // namespace ge2::quantize_fp8
