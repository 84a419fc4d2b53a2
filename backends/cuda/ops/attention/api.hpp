// attention: O = softmax(softcap(scale * Q K^T) + bias + masks) V per (batch, head), with grouped K/V heads (GQA:
// query head h reads K/V head h / (heads_q / heads_kv)) and an optional additive bias [1 or batch, 1 or heads_q,
// seq_q, seq_k] of the inputs' dtype (a padding mask, a relative position bias; -inf hides a key). Causal uses the
// top-left alignment (PyTorch's is_causal): query row i sees keys j <= i, whatever seq_q and seq_k are. A sliding
// window (left, right) uses the bottom-right alignment (FlashAttention's): row i sees keys
// i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right, -1 leaving a side unbounded; causal and the window
// apply together. A soft cap c > 0 turns each scaled score s into c tanh(s / c) before the bias and the mask. A row
// with no visible key gives O = 0 and lse = +inf (so P = exp(s - lse) = 0 in the backward). float32 math and softmax
// statistics whatever the storage type.
//   forward:  O, and lse[b, h, i] = log(sum_j exp(scale * q_i . k_j)) over the visible keys (float32)
//   backward: D_i = dO_i . O_i; P_ij = exp(scale * q_i . k_j - lse_i); dS_ij = P_ij * (dO_i . v_j - D_i)
//             dQ_i = scale * sum_j dS_ij k_j; dK_j = scale * sum_i dS_ij q_i; dV_j = sum_i P_ij dO_i
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::attention {

enum class Kernel { Cudnn, FlashSm90, Rowwise, Flash, Unfused };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

constexpr int64_t kMaxRowwiseHeadDim = 256;  // rowwise: a lane holds head_dim / 32 values of a row in registers
constexpr int64_t kMaxCudnnHeadDim = 256;  // cuDNN's 16-bit SDPA, forward and backward, on sm_90
constexpr int64_t kMaxSeq = 65535 * 8;  // grid.y tiles of 8 rows

// Sizes and element strides of Q, K/V and O (O and the gradients share Q's strides, dK/dV share K's). The
// strides express both layouts: [batch, heads, seq, head_dim] and [batch, seq, heads, head_dim].
struct Shape {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  bool seq_major = false;  // true: [batch, seq, heads, head_dim]
  float scale = 1.0f;
  bool causal = false;
  DType dtype = DType::Float16;
  // The additive bias [bias_batch, bias_heads, seq_q, seq_k] (contiguous; bias_batch 1 or batch, bias_heads 1 or
  // heads_q, broadcast where 1); 0: none.
  int64_t bias_batch = 0, bias_heads = 0;
  // The sliding window, bottom-right aligned; -1: unbounded on that side.
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;  // > 0: scores s become softcap * tanh(s / softcap)
  bool has_bias() const { return bias_batch > 0; }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }

  // The keys query row i sees: [key_begin(i), key_end(i)), none when key_end(i) <= key_begin(i). Both grow with i.
  __host__ __device__ int64_t key_begin(int64_t i) const {
    const int64_t begin = i + seq_k - seq_q - window_left;
    return window_left >= 0 && begin > 0 ? begin : 0;
  }
  __host__ __device__ int64_t key_end(int64_t i) const {
    int64_t end = seq_k;
    if (window_right >= 0 && i + seq_k - seq_q + window_right + 1 < end) end = i + seq_k - seq_q + window_right + 1;
    if (causal && i + 1 < end) end = i + 1;
    return end;
  }
  // The query rows that see key j: [query_begin(j), query_end(j)) (the inverse of the key range). Both grow with j.
  __host__ __device__ int64_t query_begin(int64_t j) const {
    int64_t begin = causal ? j : 0;
    if (window_right >= 0 && j - (seq_k - seq_q) - window_right > begin) begin = j - (seq_k - seq_q) - window_right;
    return begin;
  }
  __host__ __device__ int64_t query_end(int64_t j) const {
    const int64_t end = j - (seq_k - seq_q) + window_left + 1;
    return window_left >= 0 && end < seq_q ? end : seq_q;
  }
  // Whether some query row sees no key: the number of visible keys, min(...) - max(...) of linear functions of i,
  // is concave in i, so the first and the last row are the ones to check.
  bool has_empty_rows() const {
    return key_end(0) <= key_begin(0) || key_end(seq_q - 1) <= key_begin(seq_q - 1);
  }
};

struct ForwardArgs {
  Shape shape;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* bias = nullptr;  // when shape.has_bias()
  void* o = nullptr;
  float* lse = nullptr;  // [batch, heads_q, seq_q]
};

struct BackwardArgs {
  Shape shape;
  const void* dout = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* bias = nullptr;  // when shape.has_bias()
  const void* o = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// Empty when `kernel` can run the problem; otherwise the reason it cannot.
std::string unsupported_reason(Kernel kernel, const Shape& shape);
// Builds what `kernel` needs ahead of its first call (cudnn: the problem's cuDNN plans; not during CUDA graph
// capture); throws when cuDNN has no engine for the problem. Nothing to do for the other kernels.
void prepare(Kernel kernel, const Shape& shape, bool backward);
// Bytes of per-stream workspace the forward (backward == false) or backward of `kernel` takes for the problem.
std::size_t workspace_bytes(Kernel kernel, const Shape& shape, bool backward);

// Run `kernel`, which the Python selector chose (nothing here chooses): std::invalid_argument naming why when it
// cannot run the problem (flash also needs 16-byte aligned inputs and 4-byte aligned outputs, flash_sm90 16-byte
// aligned inputs and outputs), std::runtime_error
// when cuDNN declines it at run time (no engine, an offset view).
void forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream);
void backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: one launcher per kernel variant (kernels/*.cu), arguments already checked ----------------------
void launch_rowwise_forward(const ForwardArgs& args, cudaStream_t stream);
// row_dot: float32 scratch of batch * heads_q * seq_q for D_i = dO_i . O_i.
void launch_rowwise_backward(const BackwardArgs& args, float* row_dot, cudaStream_t stream);
void launch_flash_forward(const ForwardArgs& args, cudaStream_t stream);
// workspace: flash_backward_workspace_bytes(shape) of device scratch (D_i and the float32 dQ accumulator).
std::size_t flash_backward_workspace_bytes(const Shape& shape);
void launch_flash_backward(const BackwardArgs& args, void* workspace, cudaStream_t stream);
// The two kernels around flash's and flash_sm90's main backward kernel (float16/bfloat16): row_dot writes
// D_i = dO_i . O_i and zeroes the float32 dQ accumulator [batch, heads_q, seq_q, head_dim]; dq_store writes
// dq = scale * accumulator in dq's dtype and layout.
struct FlashBackwardWorkspace {
  float* row_dot;         // batch * heads_q * seq_q, after the accumulator
  float* dq_accumulator;  // batch * heads_q * seq_q * head_dim, at the workspace's start
};
FlashBackwardWorkspace flash_backward_workspace(const Shape& shape, void* workspace);
void launch_flash_backward_row_dot(const BackwardArgs& args, const FlashBackwardWorkspace& workspace,
                                   cudaStream_t stream);
void launch_flash_backward_dq_store(const BackwardArgs& args, const FlashBackwardWorkspace& workspace,
                                    cudaStream_t stream);
// workspace: unfused_workspace_bytes(shape, backward) of device scratch (a chunk's scores and probabilities; for
// the backward also D_i and, for 16-bit dK/dV summed over several GEMMs, their float32 sums).
std::size_t unfused_workspace_bytes(const Shape& shape, bool backward);
void launch_unfused_forward(const ForwardArgs& args, void* workspace, cudaStream_t stream);
void launch_unfused_backward(const BackwardArgs& args, void* workspace, cudaStream_t stream);
// flash_sm90 (kernels/flash_sm90.cu, its sm_90a kernels in sm90/): empty reasons when built with CUTLASS's headers
// and run on an sm_90 device. The backward's workspace is flash's (flash_backward_workspace_bytes).
std::string flash_sm90_not_built_reason();
std::string flash_sm90_unsupported_reason(const Shape& shape);
void launch_flash_sm90_forward(const ForwardArgs& args, cudaStream_t stream);
void launch_flash_sm90_backward(const BackwardArgs& args, void* workspace, cudaStream_t stream);
// cudnn (kernels/cudnn_sdpa.cpp): empty reasons when built with the cuDNN frontend. forward/backward enqueue and
// return empty, or return why cuDNN declined the problem at run time (no engine, an offset view), enqueuing nothing.
std::string cudnn_not_built_reason();
std::string cudnn_unsupported_reason(const Shape& shape);
void cudnn_prepare(const Shape& shape, bool backward);
std::string cudnn_forward(const ForwardArgs& args, cudaStream_t stream);
std::string cudnn_backward(const BackwardArgs& args, cudaStream_t stream);

}  // namespace ge2::attention
