// cutlass_sm90 instantiation: cutlass::bfloat16_t, activation relu (one per file so they compile in parallel).
#include "gemm_sm90.cuh"

namespace ge2::gemm::cutlass_sm90 {
void launch_bf16_relu(const Problem& problem, TileConfig config, cudaStream_t stream) {
  launch<cutlass::bfloat16_t, cutlass::epilogue::thread::ReLu>(problem, config, stream);
}
}  // namespace ge2::gemm::cutlass_sm90
