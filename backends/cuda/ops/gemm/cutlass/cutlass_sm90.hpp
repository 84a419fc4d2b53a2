// The cutlass_sm90 gemm candidate (built when CMake finds CUTLASS's headers: GE2_WITH_CUTLASS=1).
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace ge2::gemm::cutlass_sm90 {

// D = act(alpha * A @ B + beta * C + bias[col]); row-major, no transposes; c and bias may be null.
struct Problem {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// Tile shape and schedule: chosen per problem shape by the table in tile_table.hpp (benchmarks/sweep_cutlass_gemm.py).
enum class TileConfig { Cooperative128x128, Pingpong64x128 };

// One per (dtype, activation) translation unit.
#define GE2_CUTLASS_SM90_LAUNCHER(dtype_name, act_name) \
  void launch_##dtype_name##_##act_name(const Problem& problem, TileConfig config, cudaStream_t stream);
#define GE2_CUTLASS_SM90_LAUNCHERS(dtype_name)   \
  GE2_CUTLASS_SM90_LAUNCHER(dtype_name, none)    \
  GE2_CUTLASS_SM90_LAUNCHER(dtype_name, relu)    \
  GE2_CUTLASS_SM90_LAUNCHER(dtype_name, gelu)    \
  GE2_CUTLASS_SM90_LAUNCHER(dtype_name, gelu_erf) \
  GE2_CUTLASS_SM90_LAUNCHER(dtype_name, silu)
GE2_CUTLASS_SM90_LAUNCHERS(f16)
GE2_CUTLASS_SM90_LAUNCHERS(bf16)
#undef GE2_CUTLASS_SM90_LAUNCHERS
#undef GE2_CUTLASS_SM90_LAUNCHER

}  // namespace ge2::gemm::cutlass_sm90
