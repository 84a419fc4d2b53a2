// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as
// GEMMs, the piecewise-linear activations (none, relu, leaky_relu), the four PointwiseTile tiles (one file per dtype so
// they compile in parallel).
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_1x1_f16(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream) {
  fprop_1x1<cutlass::half_t>(args, tile, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
