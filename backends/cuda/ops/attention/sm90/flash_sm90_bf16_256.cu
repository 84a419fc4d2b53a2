// flash_sm90 instantiation: cutlass::bfloat16_t, head_dim 256 (one per file so they compile in parallel).
#include "flash_sm90.cuh"
#include "flash_sm90.hpp"

namespace ge2::attention::flash_sm90 {
void launch_bf16_256(const ForwardArgs& args, cudaStream_t stream) { launch<256, cutlass::bfloat16_t>(args, stream); }
}  // namespace ge2::attention::flash_sm90
