// The flash_sm90 forward's instantiations (sm90/flash_sm90_*.cu, compiled for sm_90a when CMake finds CUTLASS's
// headers: GE2_WITH_CUTLASS=1), one per (dtype, head_dim) so they compile in parallel. Arguments already checked.
#pragma once
#include <cuda_runtime.h>

#include "../api.hpp"

namespace ge2::attention::flash_sm90 {

void launch_f16_64(const ForwardArgs& args, cudaStream_t stream);
void launch_f16_128(const ForwardArgs& args, cudaStream_t stream);
void launch_bf16_64(const ForwardArgs& args, cudaStream_t stream);
void launch_bf16_128(const ForwardArgs& args, cudaStream_t stream);

}  // namespace ge2::attention::flash_sm90
