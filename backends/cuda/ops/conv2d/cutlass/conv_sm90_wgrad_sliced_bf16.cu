// cutlass_sm90 conv2d wgrad with its reduction in slices: cutlass::bfloat16_t (one instantiation per file: they
// compile in parallel).
#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void wgrad_sliced_bf16(const BackwardArgs& args, const WgradSlices& slices, float* workspace, cudaStream_t stream) {
  wgrad_sliced<cutlass::bfloat16_t>(args, slices, workspace, stream);
}
}  // namespace ge2::conv2d::cutlass_sm90
