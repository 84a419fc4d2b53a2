// softmax / log_softmax over one axis of a contiguous array, seen as [outer, n, inner] with the softmax axis of
// length n in the middle (inner == 1: the last axis). float32 math whatever the storage type.
//   forward:  y = exp(x - max) / sum(exp(x - max))        log: y = (x - max) - log(sum(exp(x - max)))
//   backward: dx = y * (dy - sum(dy * y))                 log: dx = dy - exp(y) * sum(dy)      (y: forward output)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::softmax {

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { WarpRow, BlockRow, BlockRowTwoPass, Strided };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);
// "softmax" -> false, "log_softmax" -> true; anything else is a std::invalid_argument naming `op`.
bool is_log_from_name(const std::string& op);

// Row lengths the register kernels hold: a thread keeps at most 32 float32 values of x, or 16 each of y and dy;
// blocks of up to 512 threads (their register budget of 128 per thread holds that without spilling).
constexpr int64_t kWarpRowMax = 1024;
constexpr int64_t kBlockRowMaxForward = 16384;
constexpr int64_t kBlockRowMaxBackward = 8192;

struct ForwardArgs {
  const void* x = nullptr;
  void* y = nullptr;
  int64_t outer = 0, n = 0, inner = 1;
  DType dtype = DType::Float32;
  bool log = false;
};

struct BackwardArgs {
  const void* y = nullptr;  // the forward output
  const void* dy = nullptr;
  void* dx = nullptr;
  int64_t outer = 0, n = 0, inner = 1;
  DType dtype = DType::Float32;
  bool log = false;
};

// Empty when `kernel` can run the problem; otherwise the reason it cannot.
std::string unsupported_reason(Kernel kernel, int64_t n, int64_t inner, bool backward);

// Run `kernel` (std::invalid_argument when it cannot run the problem) and return it. Nothing is launched for
// an empty array.
Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream);
Kernel backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: one launcher per kernel variant (kernels/*.cu, backward.cu), arguments already checked ----------
void launch_warp_row_forward(const ForwardArgs& args, cudaStream_t stream);
void launch_block_row_forward(const ForwardArgs& args, cudaStream_t stream);
void launch_block_row_two_pass_forward(const ForwardArgs& args, cudaStream_t stream);
void launch_strided_forward(const ForwardArgs& args, cudaStream_t stream);
void launch_warp_row_backward(const BackwardArgs& args, cudaStream_t stream);
void launch_block_row_backward(const BackwardArgs& args, cudaStream_t stream);
void launch_block_row_two_pass_backward(const BackwardArgs& args, cudaStream_t stream);
void launch_strided_backward(const BackwardArgs& args, cudaStream_t stream);

}  // namespace ge2::softmax
