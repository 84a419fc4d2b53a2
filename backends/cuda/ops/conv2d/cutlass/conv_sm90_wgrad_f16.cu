// cutlass_sm90 conv2d wgrad instantiation: cutlass::half_t (one per file so they compile in parallel).
#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {
void wgrad_f16(const BackwardArgs& args, cudaStream_t stream) { wgrad<cutlass::half_t>(args, stream); }
}  // namespace ge2::conv2d::cutlass_sm90
