// rmsnorm over the last axis of a contiguous [rows, cols] array, float32 statistics whatever the storage type:
//   y = x * rstd * gamma,  rstd = 1 / sqrt(mean(x^2) + eps)
// Backward: dx, dgamma (column sums over every row, deterministic). The checks and kernels are shared with
// layernorm (_common/row_norm*.hpp, not centered here); launcher.cu and backward.cu instantiate them.
#pragma once
#include <cuda_runtime.h>

#include "row_norm.hpp"

namespace ge2::rmsnorm {

using row_norm::Kernel;

// x, gamma, y required (beta and mean unused); rstd (float32, one per row) is written when not null.
using ForwardArgs = row_norm::Forward;
// dy, x, gamma, dx, dgamma required (dbeta and mean unused); rstd is the saved statistic, recomputed from x when
// null; workspace: row_norm::backward_workspace_bytes() bytes of float32.
using BackwardArgs = row_norm::Backward;

inline Kernel forward(const ForwardArgs& args, Kernel requested, cudaStream_t stream) {
  return row_norm::forward<false>(args, requested, stream);
}

inline Kernel backward(const BackwardArgs& args, Kernel requested, cudaStream_t stream) {
  return row_norm::backward<false>(args, requested, stream);
}

}  // namespace ge2::rmsnorm
