// batch_norm forward. Training: partial Welford statistics per (split, channel), a per-channel finalize (saved
// statistics, running statistics, the affine coefficients), then y = x * scale + shift. Inference: the finalize
// from the running statistics, then the same affine pass.
#include <algorithm>

#include "channel_kernels.cuh"
#include "offset_index.hpp"
#include "status.hpp"

namespace ge2::batch_norm {
namespace {

__global__ void finalize_forward(const float* __restrict__ partials, int64_t splits, int64_t channels,
                                 bool training, const float* __restrict__ gamma, const float* __restrict__ beta,
                                 const float* running_mean, const float* running_var, float momentum, float eps,
                                 float* __restrict__ saved_mean, float* __restrict__ saved_invstd,
                                 float* running_mean_out, float* running_var_out, float* __restrict__ coefficients) {
  const State s = training ? merged_partials<false>(partials, splits, channels) : State{};
  const int64_t c = blockIdx.x * int64_t{kFinalizeChannels} + threadIdx.x;
  if (threadIdx.y != 0 || c >= channels) return;
  float mean, var;
  const float old_mean = running_mean[c], old_var = running_var[c];
  if (training) {
    mean = s.b;
    var = s.c / s.a;
    // The running variance is unbiased (count > 1 is checked before launch), as PyTorch keeps it.
    running_mean_out[c] = (1.0f - momentum) * old_mean + momentum * mean;
    running_var_out[c] = (1.0f - momentum) * old_var + momentum * (s.c / (s.a - 1.0f));
  } else {
    mean = old_mean;
    var = old_var;
    running_mean_out[c] = old_mean;
    running_var_out[c] = old_var;
  }
  const float invstd = 1.0f / sqrtf(var + eps);
  saved_mean[c] = mean;
  saved_invstd[c] = invstd;
  const float scale = gamma[c] * invstd;
  coefficients[c] = scale;
  coefficients[channels + c] = beta[c] - mean * scale;
}

}  // namespace

void launch_forward(const ForwardArgs& args, const Split& split, float* workspace, cudaStream_t stream) {
  const Shape& shape = args.shape;
  float* coefficients = workspace;
  float* partials = workspace + 3 * shape.channels;
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    const auto* x = static_cast<const scalar_t*>(args.x);
    auto* y = static_cast<scalar_t*>(args.y);
    dispatch_offset_index(shape.numel(), [&](auto index) {
      using Index = decltype(index);
      const auto run = [&](auto width) {
        constexpr int kPack = decltype(width)::value;
        if (args.training) {
          launch_partials<scalar_t, kPack, false, Index>(x, nullptr, nullptr, nullptr, partials, shape, split,
                                                         stream);
          GE2_CHECK_LAUNCH("batch_norm channel_partials (statistics)");
        }
        finalize_forward<<<finalize_grid(shape.channels), kFinalizeBlock, 0, stream>>>(
            partials, split.splits, shape.channels, args.training, args.gamma, args.beta, args.running_mean,
            args.running_var, args.momentum, args.eps, args.saved_mean, args.saved_invstd, args.running_mean_out,
            args.running_var_out, coefficients);
        GE2_CHECK_LAUNCH("batch_norm finalize_forward");
        launch_affine<scalar_t, kPack, false, Index>(x, nullptr, y, coefficients, shape, stream);
        GE2_CHECK_LAUNCH("batch_norm channel_affine (forward)");
      };
      if (split.vector == kPackSize<scalar_t>) {
        run(std::integral_constant<int, kPackSize<scalar_t>>{});
      } else {
        run(std::integral_constant<int, 1>{});
      }
    });
  });
}

}  // namespace ge2::batch_norm
