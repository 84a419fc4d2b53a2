// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as the
// transposed GEMM y^T = w x^T in cooperative 128 x 48 tiles (filters x pixels; CooperativePointwiseGemmFor), the
// piecewise-linear activations. For long reductions over few pixels: ResNet-50's C2048 H7 K512 at N = 32 is 132 such
// tiles (4 x 33 of 1,568 pixels), one whole wave of the H200's SMs, where 64 x 128 tiles make 100.
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_1x1_transposed_128x48_f16(const ForwardArgs& args, cudaStream_t stream) {
  using TileShape = cute::Shape<cute::_128, cute::Int<48>, cute::_64>;
  run_pointwise<TransposedPointwiseGemm<cutlass::half_t, TileShape>, true>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
