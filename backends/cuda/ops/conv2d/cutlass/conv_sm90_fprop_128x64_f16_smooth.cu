// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 128x64 tiles, the smooth activations:
// gelu, silu (one per file so they compile in parallel).
#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_128x64_f16_smooth(const ForwardArgs& args, cudaStream_t stream) {
  fprop<cutlass::half_t, 64, SmoothActivations>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
