// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as GEMMs
// in cooperative 384 x 64 tiles (pixels x filters; CooperativePointwiseGemmFor) with epilogue subtiles of 128 x 64
// (whole 128-byte rows of a 64-filter y, where the automatic 128 x 32 writes half rows), the piecewise-linear
// activations. For 64 filters: ResNet-50's C64 H56 K64 and C256 H56 K64 at N = 32 are 262 such tiles (1.98 waves of
// 132), as cuBLAS's 64 x 384 tiles of the transposed GEMM.
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void fprop_1x1_coop_384x64_f16(const ForwardArgs& args, cudaStream_t stream) {
  using TileShape = cute::Shape<cute::Int<384>, cute::_64, cute::_64>;
  using Gemm = typename CooperativePointwiseGemmFor<cutlass::half_t, TileShape, false, gemm::cutlass_sm90::Cluster1x1,
                                                    cute::Shape<cute::_128, cute::_64>>::Gemm;
  run_pointwise<Gemm>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
