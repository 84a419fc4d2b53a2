// cutlass_sm90 conv2d dgrad instantiation: 128x128 tiles, cutlass::bfloat16_t (one per file: they compile in parallel).
#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void dgrad_128x128_bf16(const BackwardArgs& args, cudaStream_t stream) {
  dgrad<cutlass::bfloat16_t, 128>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
