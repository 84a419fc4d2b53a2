// cutlass_sm90 instantiation: cutlass::half_t, activation none (one per file so they compile in parallel).
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_f16_none(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch<cutlass::half_t, cutlass::epilogue::thread::Identity>(problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
