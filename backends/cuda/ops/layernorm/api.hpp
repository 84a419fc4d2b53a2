// layernorm over the last axis of a contiguous [rows, cols] array, float32 statistics whatever the storage type:
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
// Backward: dx, dgamma, dbeta (column sums over every row, deterministic). The checks and kernels are shared with
// rmsnorm (_common/row_norm*.hpp, centered here); launcher.cu and backward.cu instantiate them.
#pragma once
#include <cuda_runtime.h>

#include "row_norm.hpp"

namespace ge2::layernorm {

using row_norm::Kernel;

// x, gamma, beta, y required; mean and rstd (float32, one per row) are written when not null.
using ForwardArgs = row_norm::Forward;
// dy, x, gamma, dx, dgamma, dbeta required; mean and rstd (both or neither) are the saved statistics, recomputed
// from x when null; workspace: row_norm::backward_workspace_bytes() bytes of float32.
using BackwardArgs = row_norm::Backward;

inline Kernel forward(const ForwardArgs& args, Kernel requested, cudaStream_t stream) {
  return row_norm::forward<true>(args, requested, stream);
}

inline Kernel backward(const BackwardArgs& args, Kernel requested, cudaStream_t stream) {
  return row_norm::backward<true>(args, requested, stream);
}

}  // namespace ge2::layernorm
