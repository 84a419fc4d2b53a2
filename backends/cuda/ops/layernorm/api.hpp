// layernorm over the last axis of a contiguous [rows, cols] array, float32 statistics whatever the storage type:
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
// Backward: dx, dgamma, dbeta (column sums over every row, deterministic). The checks and kernels are shared with
// rmsnorm (_common/row_norm*.hpp, centered here); launcher.cu and backward.cu instantiate them.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "row_norm.hpp"

namespace ge2::layernorm {

using row_norm::Kernel;

// x, gamma, beta, y required; mean and rstd (float32, one per row) are written when not null.
using ForwardArgs = row_norm::Forward;
// dy, x, gamma, dx, dgamma, dbeta required; mean and rstd (both or neither) are the saved statistics, recomputed
// from x when null; workspace: backward_workspace_bytes() bytes of float32.
using BackwardArgs = row_norm::Backward;

inline Kernel forward(const ForwardArgs& args, Kernel requested, cudaStream_t stream) {
  return row_norm::forward<true>(args, requested, stream);
}

inline Kernel backward(const BackwardArgs& args, Kernel requested, cudaStream_t stream) {
  return row_norm::backward<true>(args, requested, stream);
}

inline std::size_t backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype, bool aligned,
                                            Kernel requested) {
  return row_norm::backward_workspace_bytes<true>(rows, cols, dtype, aligned, requested);
}

}  // namespace ge2::layernorm
