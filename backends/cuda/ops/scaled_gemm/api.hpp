// scaled_gemm: Y = act(scale_a * scale_b * (A @ B^T) + bias) on Hopper's FP8 tensor cores through cuBLASLt, row-major,
// A [m, k] and B [n, k] in FP8 (B is stored as nn.Linear stores its weight: the "TN" layout, the only one cuBLASLt
// runs FP8 in on Hopper), float32 accumulation. The output is bfloat16, float16, float32 or FP8; an FP8 output is
// multiplied by scale_d before its saturating cast. amax = max |act(...)| before scale_d: what delayed scaling
// records to choose the next scale_d. Scales and amax are float32 device scalars, so that nothing syncs the host.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "activation.hpp"
#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::scaled_gemm {

struct ForwardArgs {
  const void* a = nullptr;        // [m, k]
  const void* b = nullptr;        // [n, k]
  const float* scale_a = nullptr;  // device scalars: A's and B's dequantization factors
  const float* scale_b = nullptr;
  const float* scale_d = nullptr;  // device scalar, required when y is FP8 (its quantization factor)
  const void* bias = nullptr;      // [n] or nullptr; bfloat16 for float32/FP8 outputs, else the output's dtype
  void* y = nullptr;               // [m, n]
  float* amax = nullptr;           // device scalar, written; nullptr: not computed (nothing reads it)
  int64_t m = 0, n = 0, k = 0;
  DType a_dtype = DType::Float8E4M3, b_dtype = DType::Float8E4M3, y_dtype = DType::BFloat16;
  DType bias_dtype = DType::BFloat16;
  Act act = Act::None;
  bool fast_accum = false;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM: faster, accumulates in lower precision for a while
};

// Empty when cuBLASLt's FP8 matmul can run the problem (with a bias when `has_bias`) on a GPU of compute capability
// `major.minor`; otherwise the reason (dtypes, layout and alignment rules, epilogue, architecture). Null pointers
// count as aligned, so the problem alone can be asked about.
std::string unsupported_reason(const ForwardArgs& args, bool has_bias, int major, int minor);

// Enqueues the matmul; returns how the amax was produced ("cublaslt", "cublaslt+amax_kernel", see launcher.cu, or
// "cublaslt (no amax)" for a null amax).
// Throws std::invalid_argument for bad arguments and std::runtime_error when cuBLASLt fails or has no algorithm.
std::string forward(const ForwardArgs& args, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// Number of cached cuBLASLt plans (tests check that the steady state adds none).
std::size_t plan_count();

// ---- internal: launcher.cu and kernels/amax.cu ----------------------------------------------------------------
// amax = max |y| over m * n elements of a 16-bit or float32 output (NaN propagates), for outputs whose dtype
// cuBLASLt computes no amax for. Zeroes amax first.
void launch_output_amax(const void* y, DType dtype, int64_t numel, float* amax, cudaStream_t stream);

}  // namespace ge2::scaled_gemm
