// The cutlass_sm90 gemm candidate (built when CMake finds CUTLASS's headers: GE2_WITH_CUTLASS=1).
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace ge2::gemm::cutlass_sm90 {

// D = act(alpha * A @ B + beta * C + bias[col]), or with residual_after_act D = act(alpha * A @ B + bias[col]) +
// beta * C; row-major, no transposes; c and bias may be null.
struct Problem {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool residual_after_act = false;
};

// Tile shape, cluster shape and schedule (names in tile_table.hpp): chosen per problem shape by the table there
// (benchmarks/sweep_cutlass_gemm.py), or forced by GE2_CUTLASS_SM90_TILE.
// The *StreamK configurations (CUTLASS's stream-K tile scheduler: the output tiles' k iterations spread evenly over the
// persistent CTAs where the tiles would leave the last wave part-empty, partial sums fixed up through a workspace in a
// fixed order) are instantiated for act none only (gemm_sm90_<dtype>_none.cu, the plain GEMMs they are for); the
// other activations run the same tile data-parallel.
enum class TileConfig {
  Pingpong64x128,
  Cooperative128x128,
  Pingpong128x128Cluster2x1,
  Cooperative128x256Cluster2x1,
  Cooperative128x128StreamK,
  Cooperative128x256Cluster2x1StreamK
};

// A tile configuration and the persistent tile scheduler's swizzle: it walks the output tiles in strips of
// max_swizzle tiles (1, 2, 4 or 8) across its raster direction (CUTLASS's heuristic: along the side with fewer
// tiles), so the CTAs running at once share more A and B tiles in L2.
struct Schedule {
  TileConfig config = TileConfig::Cooperative128x128;
  int max_swizzle = 1;
};

// One per (dtype, activation) translation unit.
#define GE2_CUTLASS_SM90_LAUNCHER(dtype_name, act_name) \
  void launch_##dtype_name##_##act_name(const Problem& problem, const Schedule& schedule, cudaStream_t stream);
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
