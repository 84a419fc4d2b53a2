// cutlass_sm90 configuration Cooperative128x128Cluster2x1NoC: activation none and float16 only, no C operand (see
// TileConfig in cutlass_sm90.hpp): cooperative 128x128x64 tiles in 2-CTA clusters along M.
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_f16_none_Cooperative128x128Cluster2x1NoC(const Problem& problem, const Schedule& schedule,
                                                     cudaStream_t stream) {
  launch_config_no_c<cutlass::half_t, cute::Shape<_128, _128, _64>, Cluster2x1, Cooperative, CooperativeEpilogue>(
      problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
