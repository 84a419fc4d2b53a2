// cutlass_sm90 configuration Pingpong128x128: activation none only, both dtypes (see TileConfig in
// cutlass_sm90.hpp): ping-pong 128x128x64 tiles, no cluster.
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
using Tile128x128 = cute::Shape<_128, _128, _64>;
void launch_f16_none_Pingpong128x128(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config<cutlass::half_t, cutlass::epilogue::thread::Identity, Tile128x128, Cluster1x1, Pingpong,
                PingpongEpilogue>(problem, schedule, stream);
}
void launch_bf16_none_Pingpong128x128(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config<cutlass::bfloat16_t, cutlass::epilogue::thread::Identity, Tile128x128, Cluster1x1, Pingpong,
                PingpongEpilogue>(problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
