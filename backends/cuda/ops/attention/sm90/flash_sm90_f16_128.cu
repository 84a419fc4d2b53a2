// flash_sm90 instantiation: cutlass::half_t, head_dim 128 (one per file so they compile in parallel).
#include "flash_sm90.cuh"
#include "flash_sm90.hpp"

namespace ge2::attention::flash_sm90 {
void launch_f16_128(const ForwardArgs& args, cudaStream_t stream) { launch<128, cutlass::half_t>(args, stream); }
}  // namespace ge2::attention::flash_sm90
