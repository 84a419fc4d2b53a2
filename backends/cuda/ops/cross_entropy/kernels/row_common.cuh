// Device code shared by the cross-entropy row kernels: what happens to a row once its max and sum of exponentials
// are known (loss, gradient scale, label checks), the per-block partial loss, and the persistent grid size.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "api.hpp"
#include "index_checks.hpp"
#include "reduction.hpp"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::cross_entropy {

constexpr float kLog2e = 1.4426950408889634f;

// exp(x - shift) on the ex2 unit. x - shift is exact for nearby values, so large logits (1e4) lose nothing.
__device__ __forceinline__ float exp_shifted(float x, float shift) { return exp2f((x - shift) * kLog2e); }

// Number of non-ignored labels, summed from the count kernel's partials by each warp on its own (no barrier).
// Every lane of the warp must call it.
__device__ __forceinline__ long long valid_label_count(const RowProblem& p) {
  long long count = 0;
  for (int i = threadIdx.x % 32; i < p.count_blocks; i += 32) count += p.partial_counts[i];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) count += __shfl_xor_sync(0xffffffffu, count, offset);
  return count;
}

// d(total loss) / d(row loss) for "sum" and "mean": the same for every row ("none" reads dloss per row).
// Every thread of the block must call it (full warps).
template <typename T>
__device__ __forceinline__ float uniform_upstream(const RowProblem& p) {
  if (p.dlogits == nullptr || p.reduction == Reduction::None) return 0.0f;
  const float upstream = p.dloss != nullptr ? to_float(static_cast<const T*>(p.dloss)[0]) : 1.0f;
  if (p.reduction == Reduction::Sum) return upstream;
  return upstream / static_cast<float>(valid_label_count(p));  // all ignored: unused (every gradient row is 0)
}

struct RowLabel {
  int64_t label;
  bool ignored;  // label == ignore_index: loss 0, gradient 0
  bool valid;    // not ignored and in [0, cols)
  float target;  // logits[row, label] when valid
};

// Read early (before the reductions) so the loads overlap the row's.
template <typename T, typename L>
__device__ __forceinline__ RowLabel read_label(const RowProblem& p, int64_t row) {
  RowLabel r;
  r.label = static_cast<int64_t>(static_cast<const L*>(p.labels)[row]);
  r.ignored = r.label == p.ignore_index;
  r.valid = !r.ignored && r.label >= 0 && r.label < p.cols;
  r.target = r.valid ? to_float(static_cast<const T*>(p.logits)[row * p.cols + r.label]) : 0.0f;
  return r;
}

// dlogits[row, col] = ignored ? 0 : exp(x - row_max) * scaled_inverse_sum - (col == label ? scale : 0).
// An out-of-range label makes the loss and every gradient of the row NaN.
struct RowOutcome {
  float loss;
  float scale;               // upstream gradient of this row's loss
  float scaled_inverse_sum;  // scale / sum(exp(x - row_max))
};

template <typename T>
__device__ __forceinline__ RowOutcome finish_row(const RowProblem& p, int64_t row, const RowLabel& label,
                                                 float row_max, float row_sum, float upstream) {
  RowOutcome outcome{0.0f, 0.0f, 0.0f};
  if (label.ignored) return outcome;
  if (!label.valid) {
    outcome.loss = outcome.scale = outcome.scaled_inverse_sum = __int_as_float(0x7fc00000);  // NaN
    return outcome;
  }
  outcome.loss = row_max + logf(row_sum) - label.target;
  if (p.dlogits != nullptr) {
    outcome.scale = p.reduction != Reduction::None ? upstream
                    : p.dloss != nullptr           ? to_float(static_cast<const T*>(p.dloss)[row])
                                                   : 1.0f;
    outcome.scaled_inverse_sum = outcome.scale / row_sum;
  }
  return outcome;
}

__device__ __forceinline__ float gradient(float x, int64_t col, float row_max, const RowLabel& label,
                                          const RowOutcome& outcome) {
  if (label.ignored) return 0.0f;
  const float softmax_part = exp_shifted(x, row_max) * outcome.scaled_inverse_sum;
  return col == label.label ? softmax_part - outcome.scale : softmax_part;
}

// Done by one thread per row: the label check, the "none" output and the running (fixed-order) loss sum.
template <typename T>
__device__ __forceinline__ void record_row(const RowProblem& p, int64_t row, const RowLabel& label,
                                           const RowOutcome& outcome, float* running_loss) {
  if (!label.ignored && !label.valid) record_bad_index(p.label_error, row);
  if (p.loss_rows != nullptr) static_cast<T*>(p.loss_rows)[row] = from_float<T>(outcome.loss);
  *running_loss += outcome.loss;
}

// partial_loss[block] = the groups' running sums in group order (deterministic). Every thread must call it.
template <int kGroups>
__device__ __forceinline__ void write_block_partial(const RowProblem& p, bool group_leader, int group,
                                                    float running_loss) {
  __shared__ float group_loss[kGroups];
  if (group_leader) group_loss[group] = running_loss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) total += group_loss[g];
    p.partial_loss[blockIdx.x] = total;
  }
}

// Persistent grid: as many blocks as fit on the GPU at once (at most one per work item and kMaxRowBlocks).
inline int persistent_grid(int blocks_per_sm, int64_t work_blocks) {
  int device = 0, sms = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t resident = static_cast<int64_t>(std::max(blocks_per_sm, 1)) * sms;
  return static_cast<int>(std::min<int64_t>({work_blocks, resident, kMaxRowBlocks}));
}

template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads) {
  int blocks = 0;
  GE2_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  return blocks;
}

}  // namespace ge2::cross_entropy
