// batch_norm backward: partial sums of dy and dy * xhat per (split, channel) from the saved statistics, a
// per-channel finalize (dgamma, dbeta and the coefficients of dx = a * dy + b * x + c), then the dx pass.
#include <algorithm>

#include "kernels/channel_kernels.cuh"
#include "offset_index.hpp"
#include "status.hpp"

namespace ge2::batch_norm {
namespace {

__global__ void finalize_backward(const float* __restrict__ partials, int64_t splits, int64_t channels, float count,
                                  bool training, const float* __restrict__ gamma, const float* __restrict__ mean,
                                  const float* __restrict__ invstd, float* __restrict__ dgamma,
                                  float* __restrict__ dbeta, float* __restrict__ coefficients) {
  const State sums = merged_partials<true>(partials, splits, channels);
  const int64_t c = blockIdx.x * int64_t{kFinalizeChannels} + threadIdx.x;
  if (threadIdx.y != 0 || c >= channels) return;
  dbeta[c] = sums.a;
  dgamma[c] = sums.b;
  const float a = gamma[c] * invstd[c];
  // Training: the batch statistics depend on x, dx = a * (dy - dbeta / count - xhat * dgamma / count).
  const float b = training ? -a * invstd[c] * sums.b / count : 0.0f;
  coefficients[c] = a;
  coefficients[channels + c] = b;
  coefficients[2 * channels + c] = training ? -a * sums.a / count - b * mean[c] : 0.0f;
}

}  // namespace

void launch_backward(const BackwardArgs& args, const Split& split, float* workspace, cudaStream_t stream) {
  const Shape& shape = args.shape;
  float* coefficients = workspace;
  float* partials = workspace + 3 * shape.channels;
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    const auto* dy = static_cast<const scalar_t*>(args.dy);
    const auto* x = static_cast<const scalar_t*>(args.x);
    auto* dx = static_cast<scalar_t*>(args.dx);
    dispatch_offset_index(shape.numel(), [&](auto index) {
      using Index = decltype(index);
      const auto run = [&](auto width) {
        constexpr int kPack = decltype(width)::value;
        launch_partials<scalar_t, kPack, true, Index>(x, dy, args.saved_mean, args.saved_invstd, partials, shape,
                                                      split, stream);
        GE2_CHECK_LAUNCH("batch_norm channel_partials (backward sums)");
        finalize_backward<<<finalize_grid(shape.channels), kFinalizeBlock, 0, stream>>>(
            partials, split.splits, shape.channels, static_cast<float>(shape.count()), args.training, args.gamma,
            args.saved_mean, args.saved_invstd, args.dgamma, args.dbeta, coefficients);
        GE2_CHECK_LAUNCH("batch_norm finalize_backward");
        launch_affine<scalar_t, kPack, true, Index>(dy, x, dx, coefficients, shape, stream);
        GE2_CHECK_LAUNCH("batch_norm channel_affine (backward)");
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
