// cutlass_sm90 configuration Cooperative128x256: activation none only, both dtypes (see TileConfig in
// cutlass_sm90.hpp): cooperative 128x256x64 tiles, no cluster.
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
using Tile128x256 = cute::Shape<_128, _256, _64>;
void launch_f16_none_Cooperative128x256(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config<cutlass::half_t, cutlass::epilogue::thread::Identity, Tile128x256, Cluster1x1, Cooperative,
                CooperativeEpilogue>(problem, schedule, stream);
}
void launch_bf16_none_Cooperative128x256(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config<cutlass::bfloat16_t, cutlass::epilogue::thread::Identity, Tile128x256, Cluster1x1, Cooperative,
                CooperativeEpilogue>(problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
