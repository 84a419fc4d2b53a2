// cross_entropy launcher: argument checks, the stream workspace (partial sums, label-error slot) and the named
// kernel (warp_row, block_row or streaming). For "mean" a count kernel runs first; for "sum"/"mean" with a loss a
// one-block finalize kernel runs last.
#include <algorithm>
#include <cstdint>
#include <string>

#include "api.hpp"
#include "index_checks.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"
#include "vector_access.hpp"

namespace ge2::cross_entropy {

Kernel kernel_from_name(const std::string& name) {
  if (name == "warp_row") return Kernel::WarpRow;
  if (name == "block_row") return Kernel::BlockRow;
  if (name == "streaming") return Kernel::Streaming;
  throw std::invalid_argument("kernel: expected one of warp_row, block_row, streaming, got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::WarpRow: return "warp_row";
    case Kernel::BlockRow: return "block_row";
    case Kernel::Streaming: return "streaming";
  }
  return "unknown";
}

Reduction reduction_from_name(const std::string& name) {
  if (name == "none") return Reduction::None;
  if (name == "sum") return Reduction::Sum;
  if (name == "mean") return Reduction::Mean;
  throw std::invalid_argument("reduction: expected one of none, sum, mean, got '" + name + "'");
}

std::vector<KernelInfo> kernel_table() {
  return with_dtypes({
      {"warp_row", 30, "one warp per row, row held in registers: one read of the logits, one write of the gradient",
       "cols <= 128 x (16 / itemsize) with 16-byte aligned logits/dlogits and cols % (16 / itemsize) == 0, "
       "else cols <= 128"},
      {"block_row", 20, "one block (256-1024 threads) per row, row held in registers: one read, one write",
       "cols <= 8192 x (16 / itemsize) (65536 for float16/bfloat16); 16-byte aligned logits/dlogits and "
       "cols % (16 / itemsize) == 0"},
      {"streaming", 10, "one block per row, online max/sum pass then a gradient pass: the path that always works",
       "none (reads each row twice when computing the gradient)", kFallback, kAnyAlignment},
  }, floating_dtypes());
}

std::string unsupported_reason(Kernel kernel, int64_t cols, DType dtype, bool vectorizable) {
  switch (kernel) {
    case Kernel::WarpRow: {
      const int64_t capacity = warp_row_capacity(dtype, vectorizable);
      if (cols > capacity) {
        return "rows of " + std::to_string(cols) + " classes exceed the warp's register capacity of " +
               std::to_string(capacity) + (vectorizable ? "" : " (unvectorized: misaligned or odd row length)");
      }
      return "";
    }
    case Kernel::BlockRow: {
      if (!vectorizable) {
        return "needs 16-byte aligned logits/dlogits and cols a multiple of " +
               std::to_string(16 / dtype_size(dtype));
      }
      const int64_t capacity = block_row_capacity(dtype, true);
      if (cols > capacity) {
        return "rows of " + std::to_string(cols) + " classes exceed the block's register capacity of " +
               std::to_string(capacity);
      }
      return "";
    }
    case Kernel::Streaming: return "";
  }
  return "";
}

namespace {

// Workspace layout: the label-error slot, then the row kernel's partial losses, then the count kernel's counts.
constexpr std::size_t kErrorOffset = 0;
constexpr std::size_t kPartialLossOffset = 256;
constexpr std::size_t kPartialCountOffset = kPartialLossOffset + sizeof(float) * kMaxRowBlocks;
constexpr std::size_t kWorkspaceBytes = kPartialCountOffset + sizeof(long long) * kMaxCountBlocks;

bool ranges_overlap(const void* a, const void* b, std::size_t bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

void check_args(const Args& args) {
  if (args.rows < 0) throw std::invalid_argument("rows: expected >= 0, got " + std::to_string(args.rows));
  if (args.cols < 1) throw std::invalid_argument("cols: expected >= 1 class, got " + std::to_string(args.cols));
  if (args.rows > 0 && args.cols > INT64_MAX / args.rows) {
    throw std::invalid_argument("rows, cols: rows * cols overflows int64");
  }
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  if (args.label_dtype != DType::Int32 && args.label_dtype != DType::Int64) {
    throw std::invalid_argument(std::string("labels: expected dtype int32 or int64, got ") +
                                dtype_name(args.label_dtype));
  }
  if (args.loss_dtype != args.dtype && (args.loss_dtype != DType::Float32 || args.reduction == Reduction::None)) {
    throw std::invalid_argument(std::string("loss_dtype: expected the logits' dtype ") + dtype_name(args.dtype) +
                                " or float32 for a reduced loss, got " + dtype_name(args.loss_dtype) +
                                " (reduction " + (args.reduction == Reduction::None ? "none" : "sum/mean") + ")");
  }
  if (args.loss == nullptr && args.dlogits == nullptr && args.rows > 0) {
    throw std::invalid_argument("loss, dlogits: at least one output is needed");
  }
  if (args.dloss != nullptr && args.dlogits == nullptr && args.rows > 0) {
    throw std::invalid_argument("dloss: given without dlogits (the gradient it would scale)");
  }
  if (args.rows > 0) {
    if (args.logits == nullptr) throw std::invalid_argument("logits: null device pointer");
    if (args.labels == nullptr) throw std::invalid_argument("labels: null device pointer");
  }
  if (args.dlogits != nullptr && args.rows > 0 &&
      ranges_overlap(args.logits, args.dlogits,
                     static_cast<std::size_t>(args.rows * args.cols) * dtype_size(args.dtype))) {
    throw std::invalid_argument("dlogits: must not overlap logits (the row kernels re-read logits while writing)");
  }
}

}  // namespace

Kernel run(const Args& args, Kernel kernel, bool check_labels, cudaStream_t stream) {
  check_args(args);
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(args.dtype));
  const bool vectorizable = args.cols % vec == 0 && is_aligned(args.logits, 16) &&
                            (args.dlogits == nullptr || is_aligned(args.dlogits, 16));
  const std::string reason = unsupported_reason(kernel, args.cols, args.dtype, vectorizable);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }

  // Nothing to write: no rows, and no reduced loss (whose value for zero rows is 0 or NaN).
  if (args.rows == 0 && (args.loss == nullptr || args.reduction == Reduction::None)) return kernel;

  auto* workspace = static_cast<char*>(StreamWorkspace::get(kWorkspaceBytes, stream));
  RowProblem problem{};
  problem.logits = args.logits;
  problem.labels = args.labels;
  problem.dloss = args.dloss;
  problem.loss_rows = args.reduction == Reduction::None ? args.loss : nullptr;
  problem.dlogits = args.dlogits;
  problem.rows = args.rows;
  problem.cols = args.cols;
  problem.ignore_index = args.ignore_index;
  problem.reduction = args.reduction;
  problem.partial_loss = reinterpret_cast<float*>(workspace + kPartialLossOffset);
  problem.partial_counts = reinterpret_cast<const long long*>(workspace + kPartialCountOffset);
  problem.label_error = reinterpret_cast<unsigned long long*>(workspace + kErrorOffset);

  const bool check = check_labels && args.rows > 0;
  if (check) reset_index_error(problem.label_error, stream);
  if (args.reduction == Reduction::Mean) {
    problem.count_blocks =
        launch_count_labels(args.labels, args.label_dtype, args.rows, args.ignore_index,
                            reinterpret_cast<long long*>(workspace + kPartialCountOffset), stream);
  }
  int grid = 0;
  if (args.rows > 0) {
    bool launched = true;
    switch (kernel) {
      case Kernel::WarpRow:
        launched = launch_warp_row(problem, args.dtype, args.label_dtype, vectorizable, &grid, stream);
        break;
      case Kernel::BlockRow:
        launched = launch_block_row(problem, args.dtype, args.label_dtype, vectorizable, &grid, stream);
        break;
      case Kernel::Streaming:
        launch_streaming(problem, args.dtype, args.label_dtype, vectorizable, &grid, stream);
        break;
    }
    if (!launched) {  // unsupported_reason and the launchers' tables disagree: a bug, never a user error
      throw std::logic_error(std::string("cross_entropy: kernel '") + kernel_name(kernel) + "' has no variant for " +
                             std::to_string(args.cols) + " classes");
    }
  }
  if (args.loss != nullptr && args.reduction != Reduction::None) {
    launch_finalize(problem.partial_loss, grid, problem.partial_counts, problem.count_blocks, args.reduction,
                    args.loss, args.loss_dtype, stream);
  }
  if (check) {
    const IndexError error = take_index_error(problem.label_error, args.labels, args.label_dtype, stream);
    if (error.position >= 0) {
      throw std::invalid_argument("labels: label " + std::to_string(error.value) + " at row " +
                                  std::to_string(error.position) + " is outside [0, " + std::to_string(args.cols) +
                                  ") and is not ignore_index (" + std::to_string(args.ignore_index) + ")");
    }
  }
  return kernel;
}

}  // namespace ge2::cross_entropy
