// cutlass_sm90 conv2d forward, 1x1 GEMM trial tiles (session 37, float16, measured in the mid call against the
// main tiles; removed after it but for the winner): the cooperative 128x128 and 256x128.
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
bool fprop_1x1_trial_b_f16(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream) {
  using Element = cutlass::half_t;
  using cute::_64;
  using cute::_128;
  using cute::_192;
  using cute::_256;
  switch (tile) {
    case PointwiseTile::Cooperative128x128:
      run_pointwise<CooperativePointwiseGemm<Element, cute::Shape<_128, _128, _64>>>(args, stream);
      break;
    case PointwiseTile::Cooperative256x128:
      run_pointwise<CooperativePointwiseGemm<Element, cute::Shape<_256, _128, _64>>>(args, stream);
      break;
    default:
      return false;
  }
  return true;
}
}  // namespace ge2::conv2d::cutlass_sm90
