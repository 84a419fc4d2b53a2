// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as the
// transposed GEMM y^T = w x^T in cooperative 128 x 192 tiles (filters x pixels; trans_128x192_noc), the
// piecewise-linear activations, without the epilogue's source operand (ConvNoCEpilogue: problems without a residual
// only; fprop_1x1 sends the others to the sibling with one), and its twin on PlainEpilogue for a plain convolution.
// Its own file: it compiles alongside the others.
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
namespace {
using TileShape = cute::Shape<cute::_128, cute::_192, cute::_64>;
using Gemm = TransposedPointwiseGemmFor<cutlass::half_t, TileShape, PointwiseEpilogueKind::NoC>::Gemm;
// The mainloop's stages without C against the sibling's with C (34,816 -> 18,432 bytes of epilogue shared memory;
// cuBLAS's nvjet 128x192_64x5 has 5).
static_assert(kMainloopStages<Gemm> == 5 &&
              kMainloopStages<TransposedPointwiseGemmFor<cutlass::half_t, TileShape>::Gemm> == 4);
using PlainGemm = TransposedPointwiseGemmFor<cutlass::half_t, TileShape, PointwiseEpilogueKind::Plain>::Gemm;
}  // namespace

void fprop_1x1_noc_transposed_128x192_f16(const ForwardArgs& args, cudaStream_t stream) {
  if (plain_epilogue(args)) return run_pointwise<PlainGemm, true>(args, stream);
  run_pointwise<Gemm, true>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
