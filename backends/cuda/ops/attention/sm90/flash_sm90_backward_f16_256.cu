// flash_sm90 backward instantiation: cutlass::half_t, head_dim 256 (one per file so they compile in parallel).
#include "flash_sm90.hpp"
#include "flash_sm90_backward.cuh"

namespace ge2::attention::flash_sm90 {
void launch_backward_f16_256(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                             cudaStream_t stream) {
  launch_backward<256, cutlass::half_t>(args, row_dot, dq_accumulator, stream);
}
}  // namespace ge2::attention::flash_sm90
