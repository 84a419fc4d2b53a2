// cutlass_sm90 conv2d dgrad instantiation: cutlass::half_t (one per file so they compile in parallel).
#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void dgrad_f16(const BackwardArgs& args, cudaStream_t stream) { dgrad<cutlass::half_t>(args, stream); }
}  // namespace ge2::conv2d::cutlass_sm90
