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
// Tried and left out (H200, session 35, plain GEMMs against cuBLASLt, L2 flushed): CUTLASS's stream-K tile scheduler
// on the cooperative 128x128 and 128x256 cluster 2x1 kernels. At 2048^3 and 8192x1024x4096 float16 it reached
// 0.72-0.84x, against 0.87-0.99x for the table's data-parallel choice; only bfloat16 8192x1024x4096 gained (1.03x
// against 0.92x), where the data-parallel 128x256 cluster 2x1 tile with swizzle 8 reached 1.08x. Session 36 (plain
// GEMMs against cuBLASLt, device time with the host's launch hidden): 2-CTA clusters along N (A multicast) in
// cooperative 128x128, 128x256 and 256x128 tiles won no target shape: 2048^3 0.915-0.958x and 8192x1024x4096
// 0.919-0.982x (the cluster-free 128x128 ping-pong and 128x256 cooperative tiles: 0.938-0.968x, 0.968-0.990x),
// 8192^3 0.80-0.96x (the table's 128x256 cluster 2x1, swizzle 8: 0.985-1.005x).
// Cooperative128x256 and Pingpong128x128, without clusters, are compiled for act none only (gemm_sm90_none_<config>.cu:
// the plain product's table picks them, the activations' does not); another activation refuses them.
// Pingpong128x128Cluster2x1NoC (session 37; bfloat16 since session 39) is compiled for act none only, without a C
// operand (gemm_sm90.cuh's BiasEpilogue: no C in shared memory, each TMA store delayed by one subtile); forced on a
// problem with a residual it runs Pingpong128x128Cluster2x1, and the table gives such problems the activations' choice.
// Session 37's mid call (H200, device time, float16): 2048^3 29.4 us against 31.0 for the table's ping-pong 128x128
// (cuBLASLt 30.3), 8192^3 1706 against 1760 us for cooperative 128x256 cluster 2x1 (cuBLASLt 1818). Tried there and
// left out: the same tiles without a cluster (2048^3 29.8 us, 4096^3 205.2 against 193.6), in clusters along N (TMA
// multicasts A; cuBLASLt's 2048^3 kernel clusters along its M, our N: 29.2 us at 2048^3 and 1700.8 at 8192^3, within
// noise of the kept one, but 251 us against 102 at 8192x1024x4096 with swizzle 8), with 64x64 epilogue subtiles (29.5
// us against 29.4), cooperative 128x128 in clusters along M without C (30.3 us at 2048^3).
enum class TileConfig {
  Pingpong64x128,
  Cooperative128x128,
  Pingpong128x128Cluster2x1,
  Cooperative128x256Cluster2x1,
  Cooperative128x256,
  Pingpong128x128,
  Pingpong128x128Cluster2x1NoC
};

// The persistent tile scheduler's walk over the output tiles: CUTLASS's heuristic (along N when there are at least
// as many tile rows as tile columns, else along M), or forced.
enum class Raster { Heuristic, AlongM, AlongN };

// A tile configuration and the persistent tile scheduler's swizzle: it walks the output tiles in strips of
// max_swizzle tiles (1, 2, 4 or 8) across its raster direction (CUTLASS's heuristic: along the side with fewer
// tiles), so the CTAs running at once share more A and B tiles in L2.
struct Schedule {
  TileConfig config = TileConfig::Cooperative128x128;
  int max_swizzle = 1;
  Raster raster = Raster::Heuristic;
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

// The act-none-only configurations, one translation unit per configuration holding both dtypes.
#define GE2_CUTLASS_SM90_NONE_ONLY(config)                                                                  \
  void launch_f16_none_##config(const Problem& problem, const Schedule& schedule, cudaStream_t stream);  \
  void launch_bf16_none_##config(const Problem& problem, const Schedule& schedule, cudaStream_t stream);
GE2_CUTLASS_SM90_NONE_ONLY(Cooperative128x256)
GE2_CUTLASS_SM90_NONE_ONLY(Pingpong128x128)
#undef GE2_CUTLASS_SM90_NONE_ONLY

// The act-none configuration without C (one translation unit per dtype).
void launch_f16_none_Pingpong128x128Cluster2x1NoC(const Problem& problem, const Schedule& schedule,
                                                  cudaStream_t stream);
void launch_bf16_none_Pingpong128x128Cluster2x1NoC(const Problem& problem, const Schedule& schedule,
                                                   cudaStream_t stream);

}  // namespace ge2::gemm::cutlass_sm90
