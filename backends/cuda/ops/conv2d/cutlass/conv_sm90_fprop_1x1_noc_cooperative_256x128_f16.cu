// cutlass_sm90 conv2d forward instantiation: cutlass::half_t, 1x1 convolutions at stride 1 without padding as the
// cooperative 256 x 128 tiles (output pixels x filters; coop_256x128_noc), the piecewise-linear activations, without
// the epilogue's source operand (ConvNoCEpilogue: problems without a residual only; fprop_1x1 sends the others to the
// sibling with one), and its twin on PlainEpilogue for a plain convolution. Its own file: it compiles alongside the
// others.
#include "conv_sm90_1x1.cuh"

namespace ge2::conv2d::cutlass_sm90 {
namespace {
using TileShape = cute::Shape<cute::_256, cute::_128, cute::_64>;
using Gemm = CooperativePointwiseGemm<cutlass::half_t, TileShape, PointwiseEpilogueKind::NoC>;
// The mainloop's stages without C against the sibling's with C (33,792 -> 17,408 bytes of epilogue shared memory, still
// short of a fifth 48 KB stage: only the delayed TMA store differs).
static_assert(kMainloopStages<Gemm> == 4 && kMainloopStages<CooperativePointwiseGemm<cutlass::half_t, TileShape>> == 4);
using PlainGemm = CooperativePointwiseGemm<cutlass::half_t, TileShape, PointwiseEpilogueKind::Plain>;
}  // namespace

void fprop_1x1_noc_cooperative_256x128_f16(const ForwardArgs& args, cudaStream_t stream) {
  if (plain_epilogue(args)) return run_pointwise<PlainGemm>(args, stream);
  run_pointwise<Gemm>(args, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
