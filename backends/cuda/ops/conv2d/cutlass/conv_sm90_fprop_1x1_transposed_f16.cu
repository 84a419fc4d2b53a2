// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as the
// transposed GEMM y^T = w x^T in cooperative 128 x 192 tiles (filters x pixels; TransposedPointwiseGemmFor), the
// piecewise-linear activations (its own file: it compiles alongside the other tiles).
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_1x1_transposed_128x192_f16(const ForwardArgs& args, cudaStream_t stream) {
  using TileShape = cute::Shape<cute::_128, cute::_192, cute::_64>;
  run_pointwise<TransposedPointwiseGemmFor<cutlass::half_t, TileShape>::Gemm, true>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
