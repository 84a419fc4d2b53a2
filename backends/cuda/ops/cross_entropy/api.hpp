// cross_entropy: loss[r] = logsumexp(logits[r, :]) - logits[r, labels[r]] over rows of a (rows, cols) matrix, with
// dlogits[r, :] = (softmax(logits[r, :]) - onehot(labels[r])) * upstream[r], fused: one kernel reads each row once
// and writes its loss and (when asked) its gradient. Rows whose label equals ignore_index give loss 0 and gradient
// 0 and do not count for "mean". float32 math; the sum for "sum"/"mean" is deterministic (fixed-order partials).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::cross_entropy {

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { WarpRow, BlockRow, Streaming };
enum class Reduction { None, Sum, Mean };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);
Reduction reduction_from_name(const std::string& name);

// One call computes the loss, the gradient, or both (fused). Absent pointers are nullptr.
struct Args {
  const void* logits = nullptr;  // (rows, cols), dtype
  const void* labels = nullptr;  // (rows,), label_dtype (int32 or int64)
  const void* dloss = nullptr;   // upstream gradient, dtype: (rows,) for "none", () otherwise; nullptr means 1
  void* loss = nullptr;          // (rows,) for "none", () otherwise; nullptr: no loss
  void* dlogits = nullptr;       // (rows, cols); nullptr: no gradient. Must not overlap logits.
  int64_t rows = 0, cols = 0;
  DType dtype = DType::Float32;
  DType loss_dtype = DType::Float32;  // of a reduced loss ("sum"/"mean"): dtype, or float32 for 16-bit logits
  DType label_dtype = DType::Int64;
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
};

// Runs `kernel` (std::invalid_argument when it cannot run the problem) and returns it. With check_labels, a
// label outside [0, cols) that is not ignore_index raises std::invalid_argument after the launch (this waits for the
// stream); without, such rows get a NaN loss and NaN gradient and the call stays asynchronous.
Kernel run(const Args& args, Kernel kernel, bool check_labels, cudaStream_t stream);

// Empty when `kernel` can run a problem with this row length and dtype; otherwise the reason it cannot.
// `vectorizable`: logits and dlogits 16-byte aligned and cols a multiple of 16 / sizeof(dtype).
std::string unsupported_reason(Kernel kernel, int64_t cols, DType dtype, bool vectorizable);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu and kernels/*.cu -------------------------------------------------------

// Device-side view of a problem. Scratch lives in the module's stream workspace.
struct RowProblem {
  const void* logits;
  const void* labels;
  const void* dloss;
  void* loss_rows;  // per-row losses ("none" only)
  void* dlogits;
  int64_t rows, cols;
  int64_t ignore_index;
  Reduction reduction;
  float* partial_loss;                // one per block of the row kernel
  const long long* partial_counts;    // non-ignored labels, one per block of the count kernel ("mean" only)
  int count_blocks;
  unsigned long long* label_error;    // see index_error.hpp
};

// Largest grid of the row kernels (their per-block partial sums live in the workspace).
constexpr int kMaxRowBlocks = 2048;
constexpr int kMaxCountBlocks = 128;

// Row-kernel launchers; each returns false when the variant cannot take these rows.
bool launch_warp_row(const RowProblem& problem, DType dtype, DType label_dtype, bool vectorized, int* grid,
                     cudaStream_t stream);
bool launch_block_row(const RowProblem& problem, DType dtype, DType label_dtype, bool vectorized, int* grid,
                      cudaStream_t stream);
void launch_streaming(const RowProblem& problem, DType dtype, DType label_dtype, bool vectorized, int* grid,
                      cudaStream_t stream);

// Capacity (largest cols) of the register-cached variants.
int64_t warp_row_capacity(DType dtype, bool vectorized);
int64_t block_row_capacity(DType dtype, bool vectorized);

// Per-block counts of non-ignored labels, and the final fixed-order sum (divided by the count for "mean").
int launch_count_labels(const void* labels, DType label_dtype, int64_t rows, int64_t ignore_index,
                        long long* partial_counts, cudaStream_t stream);
void launch_finalize(const float* partial_loss, int row_blocks, const long long* partial_counts, int count_blocks,
                     Reduction reduction, void* loss, DType dtype, cudaStream_t stream);

}  // namespace ge2::cross_entropy
