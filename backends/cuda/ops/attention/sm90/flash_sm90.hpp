// The flash_sm90 instantiations (sm90/flash_sm90_*.cu, compiled for sm_90a when CMake finds CUTLASS's headers:
// GE2_WITH_CUTLASS=1), one per (pass, dtype, head_dim) so they compile in parallel. Arguments already checked.
#pragma once
#include <cuda_runtime.h>

#include "../api.hpp"

namespace ge2::attention::flash_sm90 {

void launch_f16_64(const ForwardArgs& args, cudaStream_t stream);
void launch_f16_128(const ForwardArgs& args, cudaStream_t stream);
void launch_bf16_64(const ForwardArgs& args, cudaStream_t stream);
void launch_bf16_128(const ForwardArgs& args, cudaStream_t stream);
void launch_f16_256(const ForwardArgs& args, cudaStream_t stream);
void launch_bf16_256(const ForwardArgs& args, cudaStream_t stream);

// The backward's main kernel: dK, dV, and dQ added to the float32 accumulator (flash's row_dot kernel wrote D and
// zeroed the accumulator before; its dq_store kernel writes dq after).
void launch_backward_f16_64(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                            cudaStream_t stream);
void launch_backward_f16_128(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                             cudaStream_t stream);
void launch_backward_bf16_64(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                             cudaStream_t stream);
void launch_backward_bf16_128(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                              cudaStream_t stream);
void launch_backward_f16_256(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                             cudaStream_t stream);
void launch_backward_bf16_256(const BackwardArgs& args, const float* row_dot, float* dq_accumulator,
                              cudaStream_t stream);

}  // namespace ge2::attention::flash_sm90
