// batch_norm over the channels of a contiguous array: x is [batch, channels, spatial] (NCHW; spatial = H * W or any
// product of trailing axes) or [batch, spatial, channels] (NHWC). float32 statistics and parameters (gamma, beta,
// running mean and variance) for every storage type of x (float32, float16, bfloat16).
//   training:  mean, var = batch statistics over (batch, spatial) per channel (var biased),
//              running_mean_out = (1 - momentum) * running_mean + momentum * mean,
//              running_var_out  = (1 - momentum) * running_var  + momentum * var * count / (count - 1)
//   inference: mean, var = running_mean, running_var (running_*_out are copies)
//   y = (x - mean) * invstd * gamma + beta, invstd = 1 / sqrt(var + eps); saved_mean, saved_invstd are written.
// Backward (from the saved statistics): dgamma = sum(dy * xhat), dbeta = sum(dy),
//   training:  dx = gamma * invstd * (dy - dbeta / count - xhat * dgamma / count)
//   inference: dx = gamma * invstd * dy
// Statistics are Welford partials per (split, channel) merged in a fixed order: deterministic. The partials live
// in the module's StreamWorkspace (grown on first use: run once on a stream before capturing it in a CUDA graph).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::batch_norm {

enum class Layout { NCHW, NHWC };
Layout layout_from_name(const std::string& name);

struct Shape {
  int64_t batch = 0, channels = 0, spatial = 0;
  Layout layout = Layout::NCHW;
  int64_t count() const { return batch * spatial; }  // elements per channel
  int64_t numel() const { return batch * channels * spatial; }
};

struct ForwardArgs {
  const void* x = nullptr;
  const float *gamma = nullptr, *beta = nullptr, *running_mean = nullptr, *running_var = nullptr;
  void* y = nullptr;
  // Outputs; running_*_out may be the running_* inputs themselves (an in-place update).
  float *saved_mean = nullptr, *saved_invstd = nullptr, *running_mean_out = nullptr, *running_var_out = nullptr;
  Shape shape;
  DType dtype = DType::Float32;
  bool training = true;
  float momentum = 0.1f, eps = 1e-5f;
};

struct BackwardArgs {
  const void *dy = nullptr, *x = nullptr;
  const float *gamma = nullptr, *saved_mean = nullptr, *saved_invstd = nullptr;
  void* dx = nullptr;
  float *dgamma = nullptr, *dbeta = nullptr;
  Shape shape;
  DType dtype = DType::Float32;
  bool training = true;
};

// Check the arguments (std::invalid_argument naming the argument) and enqueue.
void forward(const ForwardArgs& args, cudaStream_t stream);
void backward(const BackwardArgs& args, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: how channel reductions are split over blocks, and the launchers of kernels/*.cu, backward.cu ----
struct Split {
  int vector = 1;       // elements per access (16-byte vectors when the contiguous runs allow)
  int64_t splits = 1;   // blocks per channel (NCHW) or per channel tile (NHWC)
  int lanes = 1;        // NHWC: threads across channel vectors (blockDim.x)
  int64_t tiles = 1;    // NHWC: channel tiles
};
Split plan_split(const Shape& shape, DType dtype, bool aligned);
// Workspace floats: 3 * channels of per-channel coefficients, then 3 * splits * channels of partials.
std::size_t workspace_floats(const Shape& shape, const Split& split);

void launch_forward(const ForwardArgs& args, const Split& split, float* workspace, cudaStream_t stream);
void launch_backward(const BackwardArgs& args, const Split& split, float* workspace, cudaStream_t stream);

}  // namespace ge2::batch_norm
