// cutlass_sm90 configuration Pingpong128x128NoC: activation none and float16 only, no C operand (see
// TileConfig in cutlass_sm90.hpp): ping-pong 128x128x64 tiles, no cluster.
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_f16_none_Pingpong128x128NoC(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config_no_c<cutlass::half_t, cute::Shape<_128, _128, _64>, Cluster1x1, Pingpong, PingpongEpilogue>(
      problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
