// Multi-tensor kernels: block b of a launch handles chunk b of the chunk table (apex / torch multi_tensor_apply,
// with the table in device memory instead of kernel arguments, so there is no per-launch tensor limit).
//
// The update mirrors torch.optim's foreach implementations operation by operation in float32 (lerp, then
// mul + addcmul, sqrt / bias_correction2_sqrt + eps, addcdiv), so results agree with torch to rounding.
#include <cmath>
#include <type_traits>

#include "api.hpp"
#include "storage_dispatch.hpp"
#include "status.hpp"

namespace ge2::optimizer {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------------------------------------------
// grad_norm: per-chunk sum of squares (float), and the non-finite flag the loss scaler reads.
// ---------------------------------------------------------------------------------------------------------------
template <typename GradT>
__global__ void grad_norm_kernel(NormArgs args) {
  const ChunkEntry chunk = args.group.chunks[blockIdx.x];
  const TensorEntry tensor = args.group.tensors[chunk.tensor];
  const GradT* grad = reinterpret_cast<const GradT*>(tensor.grad);
  const int64_t end = min(chunk.start + args.group.chunk_size, tensor.numel);
  const float inv_scale = args.unscale ? static_cast<float>(1.0 / static_cast<double>(args.control->loss_scale)) : 1.f;
  float sum = 0.f;
  bool finite = true;
  for (int64_t i = chunk.start + threadIdx.x; i < end; i += blockDim.x) {
    const float g = to_float(grad[i]) * inv_scale;
    finite &= isfinite(g);
    sum += g * g;
  }
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = sum;
  const int any_nonfinite = __syncthreads_or(!finite);
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    args.partials[blockIdx.x] = partial[0];
    if (any_nonfinite) args.control->nonfinite = 1;  // every writer stores the same value: no race in effect
  }
}

// ---------------------------------------------------------------------------------------------------------------
// finalize: one block. Global norm (fixed-order double reduction: deterministic), skip decision, step counter,
// learning-rate schedule, bias corrections, loss-scale update.
// ---------------------------------------------------------------------------------------------------------------
__device__ double scheduled_lr(const FinalizeArgs& args, int64_t step) {
  const double s = static_cast<double>(step);
  switch (args.schedule) {
    case Schedule::Constant: return args.lr;
    case Schedule::LinearWarmup: return args.lr * fmin(1.0, s / static_cast<double>(args.warmup_steps));
    case Schedule::Cosine: {
      if (step <= args.warmup_steps) return args.lr * s / static_cast<double>(args.warmup_steps);
      const double progress = fmin(1.0, (s - args.warmup_steps) / static_cast<double>(args.total_steps -
                                                                                      args.warmup_steps));
      return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1.0 + cos(M_PI * progress));
    }
  }
  return args.lr;
}

__global__ void finalize_kernel(FinalizeArgs args) {
  __shared__ double partial[kThreads];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < args.num_partials; i += blockDim.x) sum += args.partials[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  Control* control = args.control;
  const bool norm_ran = args.num_partials > 0;
  const float norm = norm_ran ? static_cast<float>(sqrt(partial[0])) : 0.f;
  const bool nonfinite = norm_ran && control->nonfinite != 0;
  control->nonfinite = 0;
  control->grad_norm = norm;
  // Loss scaling drops an overflowing step and lowers the scale (expected, not counted); skip_nonfinite drops a
  // step whose gradients hold an inf/NaN and counts it, so the host can report it at its next read.
  const bool skip = (args.scaling || args.skip_nonfinite) && nonfinite;
  control->skipped = skip ? 1 : 0;
  if (skip && !args.scaling) {
    control->nonfinite_steps += 1;
    if (control->first_nonfinite == 0) control->first_nonfinite = static_cast<int32_t>(control->step) +
                                                                  control->nonfinite_steps;
  }
  control->inv_scale = args.scaling ? static_cast<float>(1.0 / static_cast<double>(control->loss_scale)) : 1.f;
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (total_norm + 1e-6) in float32, clamped to 1.
  control->clip_coef = args.max_norm > 0.f ? fminf(args.max_norm / (norm + 1e-6f), 1.f) : 1.f;
  if (!skip) {
    const int64_t step = control->step + 1;
    control->step = step;
    const double lr = scheduled_lr(args, step);
    control->lr = static_cast<float>(lr);
    if (args.algorithm == Algorithm::Adam) {
      const double s = static_cast<double>(step);
      control->step_size = static_cast<float>(-(lr / (1.0 - pow(args.beta1, s))));
      control->bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(args.beta2, s)));
    } else {
      control->step_size = static_cast<float>(-lr);
      control->bias_correction2_sqrt = 1.f;
    }
    control->decay = static_cast<float>(1.0 - lr * args.weight_decay);
  }
  if (args.scaling) {  // torch's _amp_update_scale_
    if (skip) {
      control->loss_scale *= args.backoff_factor;
      control->good_steps = 0;
    } else {
      const int64_t good = control->good_steps + 1;
      if (good == args.growth_interval) {
        const float grown = control->loss_scale * args.growth_factor;
        if (isfinite(grown)) control->loss_scale = grown;
        control->good_steps = 0;
      } else {
        control->good_steps = good;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// step: the update, per element, in torch's float32 operation order.
// ---------------------------------------------------------------------------------------------------------------
struct NoLow {};

constexpr int kUnroll = 4;  // elements in flight per thread: all loads issued before any math (memory parallelism)

// The per-element update on registers. s0/s1/s2: momentum buffer or exp_avg, exp_avg_sq, max_exp_avg_sq.
template <Algorithm kAlgorithm>
__device__ __forceinline__ void update(const StepArgs& args, const Control& control, bool first_step, float g,
                                       float& p, float& s0, float& s1, float& s2) {
  // __fmul_rn where torch rounds a product in its own kernel: keeps nvcc from contracting it into the next add.
  if (args.scaling) g = __fmul_rn(g, control.inv_scale);
  if (args.clipping) g = __fmul_rn(g, control.clip_coef);
  if constexpr (kAlgorithm == Algorithm::Adam) {
    if (args.weight_decay != 0.f) {
      if (args.decoupled) {
        p = __fmul_rn(p, control.decay);
      } else {
        g = g + args.weight_decay * p;
      }
    }
    // torch's lerp: small weights interpolate from self, large ones from end.
    const float w = args.one_minus_beta1;
    s0 = w < 0.5f ? s0 + w * (g - s0) : g - (g - s0) * (1.f - w);
    s1 = __fmul_rn(s1, args.beta2);
    s1 = s1 + args.one_minus_beta2 * (g * g);
    float v = s1;
    if (args.amsgrad) {
      s2 = fmaxf(s2, s1);
      v = s2;
    }
    const float denom = sqrtf(v) / control.bias_correction2_sqrt + args.eps;
    p = p + control.step_size * (s0 / denom);
  } else {
    if (args.weight_decay != 0.f) g = g + args.weight_decay * p;
    if (args.momentum != 0.f) {
      if (first_step) {
        s0 = g;
      } else {
        s0 = __fmul_rn(s0, args.momentum);
        s0 = s0 + args.one_minus_dampening * g;
      }
      g = args.nesterov ? g + args.momentum * s0 : s0;
    }
    p = p + control.step_size * g;
  }
}

template <typename GradT, typename LowT, Algorithm kAlgorithm>
__global__ void step_kernel(StepArgs args) {
  const Control control = *args.control;
  if (control.skipped) return;
  const ChunkEntry chunk = args.group.chunks[blockIdx.x];
  const TensorEntry tensor = args.group.tensors[chunk.tensor];
  const int64_t end = min(chunk.start + args.group.chunk_size, tensor.numel);
  float* __restrict__ param = reinterpret_cast<float*>(tensor.param);
  const GradT* __restrict__ grad = reinterpret_cast<const GradT*>(tensor.grad);
  float* __restrict__ state0 = reinterpret_cast<float*>(tensor.state0);
  float* __restrict__ state1 = reinterpret_cast<float*>(tensor.state1);
  float* __restrict__ state2 = reinterpret_cast<float*>(tensor.state2);
  const bool first_step = control.step == 1;
  // Which states this configuration reads and writes (the others are null in the table).
  const bool uses_state0 = kAlgorithm == Algorithm::Adam || (args.momentum != 0.f);
  const bool uses_state1 = kAlgorithm == Algorithm::Adam;
  const bool uses_state2 = kAlgorithm == Algorithm::Adam && args.amsgrad;
  const int64_t stride = blockDim.x;
  for (int64_t base = chunk.start + threadIdx.x; base < end; base += kUnroll * stride) {
    float g[kUnroll], p[kUnroll], s0[kUnroll], s1[kUnroll], s2[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * stride;
      g[k] = p[k] = s0[k] = s1[k] = s2[k] = 0.f;
      if (i < end) {
        g[k] = to_float(grad[i]);
        p[k] = param[i];
        if (uses_state0) s0[k] = state0[i];
        if (uses_state1) s1[k] = state1[i];
        if (uses_state2) s2[k] = state2[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * stride;
      if (i >= end) continue;
      update<kAlgorithm>(args, control, first_step, g[k], p[k], s0[k], s1[k], s2[k]);
      param[i] = p[k];
      if (uses_state0) state0[i] = s0[k];
      if (uses_state1) state1[i] = s1[k];
      if (uses_state2) state2[i] = s2[k];
      if constexpr (!std::is_same_v<LowT, NoLow>) reinterpret_cast<LowT*>(tensor.low)[i] = from_float<LowT>(p[k]);
    }
  }
}

template <typename GradT, typename LowT>
void launch_typed(const StepArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.group.num_chunks));
  if (args.algorithm == Algorithm::Adam) {
    step_kernel<GradT, LowT, Algorithm::Adam><<<grid, kThreads, 0, stream>>>(args);
  } else {
    step_kernel<GradT, LowT, Algorithm::SGD><<<grid, kThreads, 0, stream>>>(args);
  }
  GE2_CHECK_LAUNCH("optimizer step_kernel");
}

template <typename GradT>
void launch_with_low(const StepArgs& args, cudaStream_t stream) {
  if (!args.has_low) return launch_typed<GradT, NoLow>(args, stream);
  if (args.low_dtype == DType::Float16) return launch_typed<GradT, __half>(args, stream);
  launch_typed<GradT, __nv_bfloat16>(args, stream);
}

}  // namespace

void launch_grad_norm(const NormArgs& args, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.group.grad_dtype, "grad_dtype", {
    grad_norm_kernel<scalar_t><<<static_cast<unsigned>(args.group.num_chunks), kThreads, 0, stream>>>(args);
  });
  GE2_CHECK_LAUNCH("optimizer grad_norm_kernel");
}

void launch_finalize(const FinalizeArgs& args, cudaStream_t stream) {
  finalize_kernel<<<1, kThreads, 0, stream>>>(args);
  GE2_CHECK_LAUNCH("optimizer finalize_kernel");
}

void launch_step(const StepArgs& args, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.group.grad_dtype, "grad_dtype", { launch_with_low<scalar_t>(args, stream); });
}

}  // namespace ge2::optimizer
