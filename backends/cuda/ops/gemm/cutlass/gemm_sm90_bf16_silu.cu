// cutlass_sm90 instantiation: cutlass::bfloat16_t, activation silu (one per file so they compile in parallel).
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_bf16_silu(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch<cutlass::bfloat16_t, cutlass::epilogue::thread::SiLu>(problem, schedule, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
