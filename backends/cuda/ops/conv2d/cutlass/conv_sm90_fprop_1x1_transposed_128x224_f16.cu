// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as the
// transposed GEMM y^T = w x^T in cooperative 128 x 224 tiles (filters x pixels; CooperativePointwiseGemmFor), the
// piecewise-linear activations. cuBLAS's tile for ResNet-50's C512 H7 K2048 at N = 32 (1,568 pixels: 7 x 224).
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_1x1_transposed_128x224_f16(const ForwardArgs& args, cudaStream_t stream) {
  using TileShape = cute::Shape<cute::_128, cute::Int<224>, cute::_64>;
  run_pointwise<TransposedPointwiseGemm<cutlass::half_t, TileShape>, true>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
