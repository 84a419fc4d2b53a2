// cutlass_sm90 configuration Pingpong128x128Cluster2x1NoC, bfloat16:
// activation none only, no C operand (see TileConfig in cutlass_sm90.hpp). The launcher's body is
// gemm_sm90.cuh's launch_none_Pingpong128x128Cluster2x1NoC; one translation unit per dtype
// (gemm_sm90_none_Pingpong128x128Cluster2x1NoC_f16.cu) so the two compile in parallel.
#include "gemm_sm90.cuh"

GE2_CUTLASS_SM90_PER_DTYPE(bf16, cutlass::bfloat16_t, Pingpong128x128Cluster2x1NoC)
