// gemm: Y = act(alpha * op(A) @ op(B) + beta * C + bias), or with residual_after_act
// Y = act(alpha * op(A) @ op(B) + bias) + beta * C; row-major, bias per output column, float32 accumulation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation.hpp"
#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::gemm {

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { LtEpilogue, LtPostKernel, CutlassSm90, Tiled };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

struct ForwardArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;     // nullptr: no residual
  const void* bias = nullptr;  // nullptr: no bias
  void* y = nullptr;
  void* preact = nullptr;      // nullptr: pre-activation not saved
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::Float32;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  Act act = Act::None;
  float slope = 0.01f;
  bool allow_tf32 = false;
  bool residual_after_act = false;  // beta * C is added to act(Z) instead of into Z (preact excludes it)
};

struct BackwardArgs {
  const void* dy = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* preact = nullptr;  // required when act != None
  void* dz_scratch = nullptr;    // m x n, required when act != None
  void* da = nullptr;            // each output is skipped when nullptr
  void* db = nullptr;
  void* dbias = nullptr;
  void* dc = nullptr;
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::Float32;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  Act act = Act::None;
  float slope = 0.01f;
  bool allow_tf32 = false;
  // Layer chaining: when a_act is not None, A = a_act(a_preact) came out of the previous layer, and dA is returned
  // as the gradient w.r.t. a_preact (dA * a_act'(a_preact)), with that layer's bias gradient in dbias_a (column sums
  // of the stored dA). Gelu with trans_a == false runs as cuBLASLt's DGELU_BGRAD epilogue.
  const void* a_preact = nullptr;
  Act a_act = Act::None;
  float a_slope = 0.01f;
  void* dbias_a = nullptr;
  bool residual_after_act = false;  // the forward added beta * C after the activation: dC = beta * dY
};

// Empty when `kernel` can run the problem; otherwise the reason it cannot. `pointers_aligned` says whether the
// bias/aux pointers are 16-byte aligned (the plan's buffers always are).
std::string unsupported_reason(Kernel kernel, const ForwardArgs& args, bool pointers_aligned);

// Runs `kernel` and returns it: std::invalid_argument when it cannot run the problem, std::runtime_error when
// cuBLASLt returns no algorithm for it (the selector then tries the next candidate).
Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream);

// Empty when `kernel` (cublaslt_epilogue, cublaslt_postkernel or tiled) can run the backward call `args`, else the
// reason: for the cuBLASLt kernels, cuBLASLt's heuristic is asked for each of the call's matmuls with these pointers'
// alignment (the answer is cached with the plan the call then runs; it needs the device). Throws
// std::invalid_argument for invalid arguments.
std::string backward_unsupported_reason(Kernel kernel, const BackwardArgs& args);

// Runs `kernel`; std::invalid_argument naming the op and the reason when it cannot run `args` (nothing is enqueued
// then: the selector chooses another kernel).
void backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// Number of cached cuBLASLt plans (tests check that the steady state adds none).
std::size_t lt_plan_count();

// ---- internal: shared by launcher.cu, kernels/*.cu and backward.cu ------------------------------------------

// D[m x n] = alpha * op(A) @ op(B) (+ beta * C) with an optional cuBLASLt epilogue. Returns false when cuBLASLt
// has no algorithm for the problem (the caller raises, naming the kernel); throws on every other failure.
enum class LtEpilogue {
  Default, Bias, Relu, ReluBias, Gelu, GeluBias, GeluAux, GeluAuxBias, BiasGradA, BiasGradB, GeluGradBiasGrad
};
struct LtCall {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // read when beta != 0
  void* d = nullptr;
  const void* bias = nullptr;  // bias (forward) or bias gradient output (BiasGrad*, GeluGradBiasGrad)
  const void* aux = nullptr;   // pre-activation: written by GeluAux*, read by GeluGradBiasGrad
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::Float32;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  LtEpilogue epilogue = LtEpilogue::Default;
  bool allow_tf32 = false;
};
bool lt_matmul(const LtCall& call, cudaStream_t stream);
// Whether cuBLASLt's heuristic returns an algorithm for `call` on the current device (its plan is created and kept).
bool lt_has_algorithm(const LtCall& call);

// The plain matmul of a forward problem, alpha * op(A) @ op(B) into y, as a cuBLASLt call with no epilogue.
LtCall lt_call_for(const ForwardArgs& args);

// z = acc + beta * c + bias; preact = z (if given); y = act(z); with residual_after_act z = acc + bias and
// y = act(z) + beta * c. acc may alias y or preact.
void launch_postkernel(const void* acc, const void* c, const void* bias, void* y, void* preact, int64_t m, int64_t n,
                       DType dtype, float beta, bool residual_after_act, Act act, float slope, cudaStream_t stream);

void launch_tiled(const ForwardArgs& args, cudaStream_t stream);

// The cutlass_sm90 candidate (kernels/cutlass_sm90.cu; whether it is built: cutlass_build.hpp): empty when it runs
// `args`, else why not; its launch.
std::string cutlass_sm90_unsupported_reason(const ForwardArgs& args, bool pointers_aligned);
void launch_cutlass_sm90(const ForwardArgs& args, cudaStream_t stream);

}  // namespace ge2::gemm
