// cutlass_sm90 sweep candidate Cooperative256x128Cluster1x2: activation none only, both dtypes (see TileConfig in cutlass_sm90.hpp).
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_f16_none_Cooperative256x128Cluster1x2(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config<cutlass::half_t, cutlass::epilogue::thread::Identity, cute::Shape<_256, _128, _64>, Cluster1x2, Cooperative, CooperativeEpilogue>(
      problem, schedule, stream);
}
void launch_bf16_none_Cooperative256x128Cluster1x2(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config<cutlass::bfloat16_t, cutlass::epilogue::thread::Identity, cute::Shape<_256, _128, _64>, Cluster1x2, Cooperative, CooperativeEpilogue>(
      problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
