// cutlass_sm90 instantiation: cutlass::bfloat16_t, activation gelu_erf (one per file so they compile in parallel).
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_bf16_gelu_erf(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch<cutlass::bfloat16_t, cutlass::epilogue::thread::GELU>(problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
