// cutlass_sm90's 1x1 convolutions at stride 1 without padding, run as the GEMMs they are: y [N*H*W, K] =
// x [N*H*W, C] (row-major) times w [K, C]^T (K-major), on CUTLASS's warp-specialized persistent GEMM kernels
// (gemm/cutlass/gemm_sm90_kernel.cuh: ping-pong, or cooperative for short reductions) with the conv forward's
// epilogue visitor tree (ConvEpilogue: bias, residual, the piecewise-linear activations and the clip). Why not the
// conv collective: these layers are memory-bound (C512 H28 K128 at N = 32 reads 25 MB of x for 3.3 GFLOP) with 1-8
// reduction steps per tile, and CUTLASS 4.2's sm90 conv kernel has no persistent scheduler, so every CTA's prologue
// (pipeline fill) and epilogue were exposed (0.60-0.81x cuDNN). The persistent kernel's producer warp loads the next
// tile while the consumers run the last one's epilogue (the ping-pong kernel's two consumer warpgroups alternate
// tiles); it runs as a programmatic dependent launch (programmatic_launch(): 0.873x -> 0.950x cuDNN on C256 H56 K64,
// 0.815x -> 0.898x on C512 H28 K128).
#pragma once
// Grid dependency control for programmatic_launch() (conv_sm90.cuh); before CUTLASS's headers (this header is each 1x1
// unit's first include).
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#include "../../gemm/cutlass/gemm_sm90_kernel.cuh"
#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {

template <typename Element, typename TileShape,
          typename KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong,
          typename EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized>
using PointwiseKernelFor = gemm::cutlass_sm90::GemmKernelFor<
    Element, cutlass::layout::ColumnMajor,
    ConvEpilogue<Element, PiecewiseLinearActivations, TileShape, 16 / sizeof(Element)>, TileShape,
    gemm::cutlass_sm90::Cluster1x1, KernelSchedule, EpilogueSchedule>;
template <typename Element, typename TileShape>
using PointwiseGemm = typename PointwiseKernelFor<Element, TileShape>::Gemm;
// Both consumer warpgroups on one tile (M split between them).
template <typename Element, typename TileShape>
using CooperativePointwiseGemm =
    typename PointwiseKernelFor<Element, TileShape, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                cutlass::epilogue::TmaWarpSpecializedCooperative>::Gemm;

template <typename Gemm>
void run_pointwise(const ForwardArgs& args, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  using Element = typename Kernel::ElementA;
  const Shape& s = args.shape;
  const int m = static_cast<int>(s.n * s.h * s.w), n = static_cast<int>(s.k), k = static_cast<int>(s.c);
  // Packed strides in CuTe's (rows, reduction or columns, batch) order: x is M x C, w is K x C, y M x K.
  const auto stride_x = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(m, k, 1));
  const auto stride_w = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(n, k, 1));
  const auto stride_y = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(m, n, 1));
  const Element* residual = static_cast<const Element*>(args.residual);
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {static_cast<const Element*>(args.x), stride_x, static_cast<const Element*>(args.w), stride_w},
      // Without a residual it is never read (beta 0), but its TMA descriptor is still built: y stands in.
      {{}, residual != nullptr ? residual : static_cast<const Element*>(args.y), stride_y,
       static_cast<Element*>(args.y), stride_y},
      hardware_info()};
  set_epilogue_arguments<Element>(arguments.epilogue.thread, args);
  if (programmatic_launch()) return launch<Gemm, true>(arguments, stream);
  launch<Gemm>(arguments, stream);
}

// The tiles (output pixels x filters, 64-channel reduction steps) of PointwiseTile.
template <typename Element>
void fprop_1x1(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream) {
  if (!PiecewiseLinearActivations::has(args.act)) {
    throw std::logic_error("cutlass_sm90: the 1x1 GEMM runs the piecewise-linear activations only");
  }
  using cute::_64;
  using cute::_128;
  using cute::_256;
  switch (tile) {
    case PointwiseTile::Pingpong128x64:
      return run_pointwise<PointwiseGemm<Element, cute::Shape<_128, _64, _64>>>(args, stream);
    case PointwiseTile::Pingpong64x128:
      return run_pointwise<PointwiseGemm<Element, cute::Shape<_64, _128, _64>>>(args, stream);
    case PointwiseTile::Cooperative256x64:
      return run_pointwise<CooperativePointwiseGemm<Element, cute::Shape<_256, _64, _64>>>(args, stream);
    case PointwiseTile::Cooperative256x128:
      return run_pointwise<CooperativePointwiseGemm<Element, cute::Shape<_256, _128, _64>>>(args, stream);
  }
  throw std::logic_error("cutlass_sm90: unknown 1x1 GEMM tile");
}

}  // namespace ge2::conv2d::cutlass_sm90
