// cutlass_sm90 conv2d forward instantiation: cutlass::bfloat16_t, 64x128 tiles on the persistent ping-pong kernel
// (conv_sm90_pingpong.cuh), the piecewise-linear activations (one file per dtype so they compile in parallel).
#include "conv_sm90_pingpong.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_pingpong_64x128_bf16_linear(const ForwardArgs& args, cudaStream_t stream) {
  using cute::_64;
  using cute::_128;
  using TileShape = cute::Shape<_64, _128, cute::Shape<_64>>;
  fprop_pingpong<cutlass::bfloat16_t, PiecewiseLinearActivations, TileShape>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
