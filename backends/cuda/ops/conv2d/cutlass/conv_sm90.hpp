// The cutlass_sm90 conv2d candidate's instantiations (cutlass/conv_sm90_<pass>_<dtype>.cu, compiled for sm_90a only,
// when CMake found CUTLASS: GE2_WITH_CUTLASS=1); kernels/cutlass_sm90.cu checks the problem and picks one.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "../api.hpp"

namespace ge2::conv2d::cutlass_sm90 {

// The bottom (right) padding CUTLASS is given: the least that yields conv2d's P (Q) output rows, never negative
// (input rows the stride skips at the bottom need none).
inline int far_padding(int64_t out, int64_t in, int64_t filter, int64_t stride, int64_t dilation, int64_t near) {
  const int64_t needed = (out - 1) * stride + dilation * (filter - 1) + 1 - in - near;
  return static_cast<int>(needed > 0 ? needed : 0);
}

// The forward's activation families, each instantiated per tile and dtype: 0 for the piecewise-linear activations
// (none, relu, leaky_relu), 1 for the smooth ones (gelu, silu), -1 for an activation conv2d does not offer.
inline int activation_family(Act act) {
  if (act == Act::None || act == Act::Relu || act == Act::LeakyRelu) return 0;
  if (act == Act::Gelu || act == Act::Silu) return 1;
  return -1;
}

// wgrad's output tiles: 64 filters x 128 channels of one filter tap (CUTLASS tiles the GEMM's N = (C, S, R) along C
// only), reduced over N*P*Q in 64-pixel steps ("k tiles").
constexpr int64_t kWgradTileFilters = 64, kWgradTileChannels = 128, kWgradTilePixels = 64;

// How wgrad splits its reduction over N*P*Q (kernels/cutlass_sm90.cu chooses): `count` slices of `k_tiles_per_slice`
// consecutive k tiles (the last one shorter), each slice a layer of the grid writing its float32 partial sums of dw
// to the workspace, which one more kernel adds up and rounds to dw's dtype once. One slice writes dw directly and
// takes no workspace.
struct WgradSlices {
  int count = 1;
  int64_t k_tiles_per_slice = 0;
  std::size_t workspace_bytes = 0;
};

// y = clip(act(conv(x, w) + bias + residual)) of `args` (NHWC, groups 1, the dtype of the function's name) in
// 128 x 128 or 128 x 64 tiles of output pixels x filters (the narrow one for layers of 64 filters or fewer, where a
// 128-wide tile would compute half empty), for an activation of the family the name ends with (activation_family).
void fprop_128x128_f16_linear(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x128_f16_smooth(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x128_bf16_linear(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x128_bf16_smooth(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x64_f16_linear(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x64_f16_smooth(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x64_bf16_linear(const ForwardArgs& args, cudaStream_t stream);
void fprop_128x64_bf16_smooth(const ForwardArgs& args, cudaStream_t stream);
// The same in 64 x 128 tiles on the persistent ping-pong GEMM kernel fed by the conv collective's mainloop
// (conv_sm90_pingpong.cuh), the piecewise-linear family.
void fprop_pingpong_64x128_f16_linear(const ForwardArgs& args, cudaStream_t stream);
void fprop_pingpong_64x128_bf16_linear(const ForwardArgs& args, cudaStream_t stream);
// The forward of a 1x1 convolution at stride 1 without padding (pointwise(): y [N*H*W, K] = x [N*H*W, C] w^T) with a
// piecewise-linear activation, on CUTLASS's persistent GEMM kernel (conv_sm90_1x1.cuh) in tiles of output pixels x
// filters: ping-pong 128 x 64 or 64 x 128 (two consumer warpgroups alternating tiles), or cooperative 256 x 64 or
// 256 x 128 (both warpgroups on one tile).
enum class PointwiseTile {
  Pingpong128x64,
  Pingpong64x128,
  Cooperative256x64,
  Cooperative256x128,
  // float16 only (conv_sm90_fprop_1x1_transposed_f16.cu): the transposed GEMM y^T = w x^T in cooperative 128 x 192
  // tiles of filters x pixels.
  Transposed128x192,
  // float16 only, each in a file of its own (conv_sm90_fprop_1x1_noc_<tile>_f16.cu): the four tiles above without
  // the epilogue's source operand (ElementC void: no residual in shared memory, so more mainloop stages, and CUTLASS
  // delays each TMA store by one epilogue subtile). A problem with a residual runs on the sibling with one; a plain
  // convolution (no bias, residual, activation or clip) on the tile's twin whose epilogue only rounds (PlainEpilogue).
  Pingpong64x128NoC,
  Cooperative256x64NoC,
  Cooperative256x128NoC,
  Transposed128x192NoC,
};
// Each tile with C and its twin without C: the default rule takes the twin for a problem without a residual, and a
// twin given a residual runs on its tile with C.
inline constexpr PointwiseTile kTwinsWithoutC[][2] = {
    {PointwiseTile::Pingpong64x128, PointwiseTile::Pingpong64x128NoC},
    {PointwiseTile::Cooperative256x64, PointwiseTile::Cooperative256x64NoC},
    {PointwiseTile::Cooperative256x128, PointwiseTile::Cooperative256x128NoC},
    {PointwiseTile::Transposed128x192, PointwiseTile::Transposed128x192NoC}};
// `tile`'s twin without C (from_c) or with C (!from_c); `tile` itself where it has none.
inline PointwiseTile twin(PointwiseTile tile, bool from_c) {
  for (const auto& pair : kTwinsWithoutC) {
    if (pair[from_c ? 0 : 1] == tile) return pair[from_c ? 1 : 0];
  }
  return tile;
}
inline bool pointwise(const Shape& s, Act act) {
  return s.groups == 1 && s.r == 1 && s.s == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_top == 0 &&
         s.pad_left == 0 && s.p == s.h && s.q == s.w && activation_family(act) == 0;
}
void fprop_1x1_f16(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream);
void fprop_1x1_bf16(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream);
void fprop_1x1_transposed_128x192_f16(const ForwardArgs& args, cudaStream_t stream);
// The no-C tiles (PointwiseTile::*NoC): problems without a residual only.
void fprop_1x1_noc_pingpong_64x128_f16(const ForwardArgs& args, cudaStream_t stream);
void fprop_1x1_noc_cooperative_256x64_f16(const ForwardArgs& args, cudaStream_t stream);
void fprop_1x1_noc_cooperative_256x128_f16(const ForwardArgs& args, cudaStream_t stream);
void fprop_1x1_noc_transposed_128x192_f16(const ForwardArgs& args, cudaStream_t stream);
// dx = dgrad(dy, w) in 128 x 128 or 128 x 64 tiles (pixels x channels) and dw = wgrad(dy, x) of `args` (act none:
// dy is dz; stride 1 for dgrad); wgrad in one slice
// (dw written directly) or wgrad_sliced in `slices` (slices.count > 1) through `workspace`, slices.workspace_bytes of
// 16-byte aligned device memory.
void dgrad_128x128_f16(const BackwardArgs& args, cudaStream_t stream);
void dgrad_128x128_bf16(const BackwardArgs& args, cudaStream_t stream);
void dgrad_128x64_f16(const BackwardArgs& args, cudaStream_t stream);
void dgrad_128x64_bf16(const BackwardArgs& args, cudaStream_t stream);
void wgrad_f16(const BackwardArgs& args, cudaStream_t stream);
void wgrad_bf16(const BackwardArgs& args, cudaStream_t stream);
void wgrad_sliced_f16(const BackwardArgs& args, const WgradSlices& slices, float* workspace, cudaStream_t stream);
void wgrad_sliced_bf16(const BackwardArgs& args, const WgradSlices& slices, float* workspace, cudaStream_t stream);

}  // namespace ge2::conv2d::cutlass_sm90
