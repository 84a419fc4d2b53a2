// attention launcher: argument checks, the kernel table and the launch of the named kernel (the Python selector
// chooses). Candidates: cudnn (cuDNN's fused SDPA through the cuDNN frontend, where it was built), flash (tensor
// cores, head_dim 64 and 128, float16 and bfloat16), flash_sm90 (Hopper's wgmma and TMA, where CUTLASS's headers were
// found), rowwise (a warp per query row for the forward and dQ, a warp
// per key row for dK/dV; no cuBLAS and no score scratch; head_dim <= 256) and unfused (cuBLASLt GEMMs around a
// softmax through memory, the path that always works). flash, rowwise and unfused take every sliding window and soft
// cap; cudnn takes the windows cuDNN's diagonal band expresses and declines a soft cap.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::attention {

Kernel kernel_from_name(const std::string& name) {
  if (name == "cudnn") return Kernel::Cudnn;
  if (name == "rowwise") return Kernel::Rowwise;
  if (name == "flash") return Kernel::Flash;
  if (name == "flash_sm90") return Kernel::FlashSm90;
  if (name == "unfused") return Kernel::Unfused;
  throw std::invalid_argument("kernel: expected one of cudnn, flash, flash_sm90, rowwise, unfused (attention's "
                              "kernels), got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::Cudnn: return "cudnn";
    case Kernel::Rowwise: return "rowwise";
    case Kernel::Flash: return "flash";
    case Kernel::FlashSm90: return "flash_sm90";
    case Kernel::Unfused: return "unfused";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  const std::string cudnn_not_built = cudnn_not_built_reason();
  const std::string flash_sm90_not_built = flash_sm90_not_built_reason();
  return {
      {"cudnn", 30,
       cudnn_not_built.empty()
           ? "cuDNN's fused scaled dot-product attention through the cuDNN frontend (Graph::sdpa with its row "
             "statistics as lse, Graph::sdpa_backward reading any candidate's lse); plans from heuristics mode A (the "
             "fallback list when A has none), built once per problem and timed on the first call (the fastest is "
             "kept)"
           : "cuDNN's fused scaled dot-product attention through the cuDNN frontend: NOT BUILT (" + cudnn_not_built +
                 ")",
       "built with cuDNN and the cuDNN frontend headers; float16, bfloat16; head_dim a multiple of 8, <= " +
           std::to_string(kMaxCudnnHeadDim) + " (<= 128 before sm_90); 16-byte aligned arrays; plans built by "
           "prepare() or the first call (not during CUDA graph capture); prepare() raises when cuDNN has no engine for a "
           "problem (e.g. seq_q = seq_k = 1 in the backward), and the selector takes the next candidate; plan workspace "
           "<= 256 MiB; a window as cuDNN's diagonal band (not with causal where seq_q != seq_k, no left bound where "
           "seq_q > seq_k, no row left without a visible key); no soft cap"},
      {"flash", 20,
       "FlashAttention-2 on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async double buffering): 64 query rows "
       "per CTA, online softmax in registers; backward per 64 key rows with dQ accumulated in float32 atomics",
       "head_dim 64 or 128; float16, bfloat16; any seq_q, seq_k, window and soft cap (key tiles outside the window "
       "are skipped); 16-byte aligned arrays"},
      // Below flash until the H200 has checked it; measured choice races it against the others.
      {"flash_sm90", 15,
       std::string(flash_sm90_not_built.empty() ? "" : "NOT BUILT (" + flash_sm90_not_built + "): ") +
           "Hopper's wgmma and TMA (CuTe, sm_90a), a producer warpgroup loading tiles by TMA into a 2-stage "
           "shared-memory ring (mbarriers) and two consumer warpgroups. Forward: a CTA of 128 query rows, 64 per "
           "warpgroup, loads Q once and K/V tiles of 128 rows (80 at head_dim 256), runs S = Q K^T (shared-memory "
           "operands) and O += P V (P from registers), online softmax in float32 registers. Backward: a CTA of 128 "
           "key rows (64 at head_dim 256) loads K/V once and walks the Q/dO tiles that see them (causal skips the "
           "others), S^T, dP^T, dV += P^T dO, dK += dS^T Q in registers (head_dim 256: the warpgroups split dK and "
           "dV by columns, P^T and dS^T through shared memory), dQ = dS K added in float32 atomics",
       "built with CUTLASS's headers (GE2_CUTLASS); an sm_90 GPU; head_dim 64, 128 or 256; float16, bfloat16; any "
       "seq_q, seq_k, causal or not; no bias, window or soft cap; 16-byte aligned arrays"},
      {"rowwise", 10,
       "a warp per query row (forward, dQ) or key row (dK, dV): online softmax in float32, K/V rows streamed from "
       "L2, no tensor cores, no cuBLAS and no score scratch",
       "head_dim <= " + std::to_string(kMaxRowwiseHeadDim) + "; any seq_q, seq_k, window and soft cap; float32, "
       "float16, bfloat16",
       false, kAnyAlignment},
      {"unfused", 5,
       "S = scale Q K^T on cuBLASLt (float32 scores), a block per row for mask, softmax and lse, then O = P V on "
       "cuBLASLt, 16-bit P (and dS) as a high and a residual part (two GEMMs per product); backward recomputes P from "
       "lse. Chunks of (batch, K/V head) and query rows bound the scratch in the per-stream workspace. The path that "
       "always works",
       "none: any head_dim, seq_q, seq_k, window, soft cap, dtype and alignment (a window's masked scores are "
       "computed and ignored); workspace up to 512 MiB per chunk",
       kFallback, kAnyAlignment},
  };
}

std::string unsupported_reason(Kernel kernel, const Shape& shape) {
  if (kernel == Kernel::Cudnn) return cudnn_unsupported_reason(shape);
  if (kernel == Kernel::FlashSm90) return flash_sm90_unsupported_reason(shape);
  if (shape.has_bias() && (kernel == Kernel::Flash || kernel == Kernel::Unfused)) {
    return std::string(kernel_name(kernel)) + " takes no additive bias (cudnn and rowwise do)";
  }
  if (kernel == Kernel::Flash) {
    if (shape.head_dim != 64 && shape.head_dim != 128) {
      return "flash is built for head_dim 64 and 128, got head_dim " + std::to_string(shape.head_dim);
    }
    if (shape.dtype != DType::Float16 && shape.dtype != DType::BFloat16) {
      return std::string("flash runs float16 and bfloat16 on tensor cores: got ") + dtype_name(shape.dtype);
    }
    return "";
  }
  if (kernel == Kernel::Rowwise && shape.head_dim > kMaxRowwiseHeadDim) {
    return "rowwise holds a row in registers: needs head_dim <= " + std::to_string(kMaxRowwiseHeadDim) + ", got " +
           std::to_string(shape.head_dim);
  }
  return "";  // unfused runs every problem
}

namespace {

void check_shape(const Shape& s) {
  if (s.batch < 1 || s.heads_q < 1 || s.heads_kv < 1 || s.seq_q < 1 || s.seq_k < 1 || s.head_dim < 1) {
    throw std::invalid_argument("batch, heads_q, heads_kv, seq_q, seq_k, head_dim: expected sizes >= 1, got " +
                                std::to_string(s.batch) + ", " + std::to_string(s.heads_q) + ", " +
                                std::to_string(s.heads_kv) + ", " + std::to_string(s.seq_q) + ", " +
                                std::to_string(s.seq_k) + ", " + std::to_string(s.head_dim));
  }
  if (s.seq_q > kMaxSeq || s.seq_k > kMaxSeq || s.batch * s.heads_q > 0x7fffffff) {
    throw std::invalid_argument("seq_q, seq_k, batch * heads_q: expected <= " + std::to_string(kMaxSeq) + ", <= " +
                                std::to_string(kMaxSeq) + ", < 2^31, got " + std::to_string(s.seq_q) + ", " +
                                std::to_string(s.seq_k) + ", " + std::to_string(s.batch * s.heads_q));
  }
  if (s.heads_q % s.heads_kv != 0) {
    throw std::invalid_argument("heads_kv: expected a divisor of heads_q = " + std::to_string(s.heads_q) + ", got " +
                                std::to_string(s.heads_kv));
  }
  if (s.window_left < -1 || s.window_right < -1) {
    throw std::invalid_argument("window_left, window_right: expected >= -1 (-1: unbounded), got " +
                                std::to_string(s.window_left) + ", " + std::to_string(s.window_right));
  }
  if (!(s.softcap >= 0.0f && s.softcap < INFINITY)) {
    throw std::invalid_argument("softcap: expected a finite value >= 0 (0: off), got " + std::to_string(s.softcap));
  }
  if (!is_floating(s.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(s.dtype));
  }
  const bool batch_ok = s.bias_batch == 0 || s.bias_batch == 1 || s.bias_batch == s.batch;
  const bool heads_ok = s.has_bias() ? (s.bias_heads == 1 || s.bias_heads == s.heads_q) : s.bias_heads == 0;
  if (!batch_ok || !heads_ok) {
    throw std::invalid_argument("bias_batch, bias_heads: expected 1 or batch (" + std::to_string(s.batch) +
                                ") and 1 or heads_q (" + std::to_string(s.heads_q) + "), or 0 and 0 for no bias, got " +
                                std::to_string(s.bias_batch) + ", " + std::to_string(s.bias_heads));
  }
}

void check_bias(const Shape& s, const void* bias) {
  if (s.has_bias() != (bias != nullptr)) {
    throw std::invalid_argument(s.has_bias() ? "bias: null device pointer for a bias of bias_batch " +
                                                   std::to_string(s.bias_batch)
                                             : "bias: a pointer given with bias_batch 0 (no bias)");
  }
}

bool aligned(std::initializer_list<const void*> pointers, std::uintptr_t bytes) {
  for (const void* pointer : pointers) {
    if (reinterpret_cast<std::uintptr_t>(pointer) % bytes != 0) return false;
  }
  return true;
}

// Throws naming why `kernel` cannot run the problem; flash also reads 16-byte chunks of the inputs and stores 4-byte
// pairs of the outputs, flash_sm90 reads the inputs and stores O by TMA (16-byte rows both ways).
void require_runs(Kernel kernel, const Shape& shape, std::initializer_list<const void*> inputs,
                  std::initializer_list<const void*> outputs) {
  const std::string reason = unsupported_reason(kernel, shape);
  if (!reason.empty()) throw std::invalid_argument("kernel: " + reason);
  if (kernel == Kernel::Flash && !(aligned(inputs, 16) && aligned(outputs, 4))) {
    throw std::invalid_argument("kernel: flash needs inputs at 16-byte and outputs at 4-byte aligned addresses");
  }
  if (kernel == Kernel::FlashSm90 && !(aligned(inputs, 16) && aligned(outputs, 16))) {
    throw std::invalid_argument("kernel: flash_sm90 needs inputs and outputs at 16-byte aligned addresses");
  }
}

// Enqueues cudnn's forward or backward; std::runtime_error with cuDNN's reason when it declines the problem.
template <typename Args>
void run_cudnn(const Args& args, std::string (*run)(const Args&, cudaStream_t), cudaStream_t stream) {
  const std::string declined = run(args, stream);
  if (!declined.empty()) throw std::runtime_error("ge2 op 'attention': kernel 'cudnn': " + declined);
}

}  // namespace

void prepare(Kernel kernel, const Shape& shape, bool backward) {
  check_shape(shape);
  if (kernel != Kernel::Cudnn) return;
  const std::string reason = unsupported_reason(kernel, shape);
  if (!reason.empty()) throw std::invalid_argument("kernel: " + reason);
  cudnn_prepare(shape, backward);
}

std::size_t workspace_bytes(Kernel kernel, const Shape& shape, bool backward) {
  check_shape(shape);
  switch (kernel) {
    case Kernel::Flash:
    case Kernel::FlashSm90: return backward ? flash_backward_workspace_bytes(shape) : 0;
    case Kernel::Unfused: return unfused_workspace_bytes(shape, backward);
    case Kernel::Rowwise:  // D_i
      return backward ? static_cast<std::size_t>(shape.batch * shape.heads_q * shape.seq_q) * sizeof(float) : 0;
    case Kernel::Cudnn: break;  // its plans' workspace, sized when they are built
  }
  throw std::invalid_argument(std::string("kernel: expected flash, flash_sm90, rowwise or unfused (a kernel that "
                                          "runs with a workspace of known size), got ") + kernel_name(kernel));
}

void forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_shape(args.shape);
  check_bias(args.shape, args.bias);
  require_runs(kernel, args.shape, {args.q, args.k, args.v}, {args.o});
  switch (kernel) {
    case Kernel::Cudnn: run_cudnn(args, cudnn_forward, stream); return;
    case Kernel::Flash: launch_flash_forward(args, stream); return;
    case Kernel::FlashSm90: launch_flash_sm90_forward(args, stream); return;
    case Kernel::Rowwise: launch_rowwise_forward(args, stream); return;
    case Kernel::Unfused:
      launch_unfused_forward(args, StreamWorkspace::get(workspace_bytes(kernel, args.shape, false), stream), stream);
      return;
  }
}

void backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_shape(args.shape);
  check_bias(args.shape, args.bias);
  require_runs(kernel, args.shape, {args.dout, args.q, args.k, args.v}, {args.o, args.dq, args.dk, args.dv});
  if (kernel == Kernel::Cudnn) {
    run_cudnn(args, cudnn_backward, stream);
    return;
  }
  void* workspace = StreamWorkspace::get(workspace_bytes(kernel, args.shape, true), stream);
  if (kernel == Kernel::Flash) {
    launch_flash_backward(args, workspace, stream);
  } else if (kernel == Kernel::FlashSm90) {
    launch_flash_sm90_backward(args, workspace, stream);
  } else if (kernel == Kernel::Unfused) {
    launch_unfused_backward(args, workspace, stream);
  } else {
    launch_rowwise_backward(args, static_cast<float*>(workspace), stream);
  }
}

}  // namespace ge2::attention
