// CUTLASS's warp-specialized persistent sm90 GEMM kernel (TMA loads into a multi-stage shared-memory pipeline, wgmma,
// float32 accumulation, the persistent tile scheduler) for one epilogue visitor tree, tile, cluster and schedule:
// A (M x K) row-major, B K-major (ColumnMajor) or N-major (RowMajor), C and D (M x N) row-major. Shared by gemm's
// cutlass_sm90 candidate (gemm_sm90.cuh) and conv2d's, which runs 1x1 convolutions as GEMMs
// (conv2d/cutlass/conv_sm90_1x1.cuh).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace ge2::gemm::cutlass_sm90 {

using Cluster1x1 = cute::Shape<cute::_1, cute::_1, cute::_1>;
// Two CTAs along M share each B tile: TMA multicasts it to both.
using Cluster2x1 = cute::Shape<cute::_2, cute::_1, cute::_1>;

// The builder picks the mainloop's stage count from the shared memory the epilogue leaves; the tile scheduler is the
// data-parallel persistent one. ElementC void: an epilogue without a source operand (no C in shared memory, no C
// loads; the tree must not fetch C).
template <typename Element, typename LayoutB, typename Fusion, typename TileShape, typename ClusterShape,
          typename KernelSchedule, typename EpilogueSchedule, typename ElementC = Element>
struct GemmKernelFor {
  // A TMA box spans at most 256 elements a dimension, and A's and B's boxes span the tile's M and N. CuTe reports a
  // larger box only through an assert when it builds the descriptor, which Release builds compile out: the kernel
  // would launch with a bad descriptor and the process die (session 39's 384x64 trial tile).
  static_assert(cute::size<0>(TileShape{}) <= 256 && cute::size<1>(TileShape{}) <= 256,
                "GemmKernelFor: a tile's M and N must be at most 256 (TMA's box limit)");
  using Layout = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 16 / sizeof(Element);
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, Layout, kAlignment, Element, Layout,
      kAlignment, EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, Layout, kAlignment, Element, LayoutB, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

}  // namespace ge2::gemm::cutlass_sm90
