// The forward on CUTLASS's persistent ping-pong GEMM kernel fed by the conv collective's mainloop (TMA im2col loads of
// x, tiled loads of w): CUTLASS 4.2's sm90 ConvUniversal is its non-persistent warp-specialized GEMM kernel, whose
// grid is one CTA per tile, so a layer of few tiles pays for a part-empty last wave (C128 H28 K128 3x3 at N = 32:
// 196 tiles of 128 x 128 on 132 SMs) and every CTA's pipeline fill and epilogue are exposed. The persistent kernel
// walks 64 x 128 tiles (392 there: 2.97 per SM) with two consumer warpgroups alternating, one's epilogue under the
// other's mainloop. PingpongConvMainloop adapts the collective to the GEMM kernel: the kernel's problem is the
// collective's linearized GEMM view (M = N*P*Q, N = K, K = (C, S, R)), the conv problem (for the TMA descriptors)
// travels in the mainloop's arguments, and y (packed [N*P*Q, K]) is a row-major GEMM output.
#pragma once
// Grid dependency control for programmatic_launch() (conv_sm90.cuh); before CUTLASS's headers (this header is each
// ping-pong unit's first include).
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "conv_sm90.cuh"

namespace ge2::conv2d::cutlass_sm90 {

// What the GEMM kernel expects of a mainloop that the conv collective lacks or has in another form: the ping-pong
// schedule in its dispatch policy, the producer's thread count, GEMM (rank-3) stride types for the kernel's checks
// (the collective keeps its own), load_init's tiled views with a batch mode (the kernel reads the tile counts of
// (BLK, BLK_K, tiles, k tiles, batch) views, then hands the tuple back to load(), which passes the collective its own
// views), and the conv problem for the TMA descriptors.
template <typename ConvMainloop>
struct PingpongConvMainloop : ConvMainloop {
  struct DispatchPolicy : ConvMainloop::DispatchPolicy {
    using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  };
  static constexpr int NumProducerThreadEvents = 1;  // the producer warp's one elected thread arms each stage
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideB = StrideA;
  using ConvProblem = typename ConvMainloop::ProblemShape;
  // (M = N*P*Q, N = K, K = (C, S, R), L = 1), all run-time ints (the epilogue's TMA types are built for those).
  static auto gemm_problem(const ConvProblem& problem) {
    const auto linear = ConvMainloop::get_problem_shape_MNKL(problem);
    return cute::make_shape(int(cute::get<0>(linear)), int(cute::get<1>(linear)), cute::get<2>(linear), int(1));
  }
  using GemmProblem = decltype(gemm_problem(ConvProblem{}));
  struct Arguments : ConvMainloop::Arguments {
    ConvProblem problem{};
  };
  using Params = typename ConvMainloop::Params;
  template <typename Shape>
  static Params to_underlying_arguments(const Shape&, const Arguments& arguments, void* workspace) {
    return ConvMainloop::to_underlying_arguments(arguments.problem, arguments, workspace);
  }
  template <typename Shape>
  static bool can_implement(const Shape&, const Arguments& arguments) {
    return ConvMainloop::can_implement(arguments.problem, arguments);
  }
  template <typename ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(const ProblemShapeMNKL& problem, const Params& params) {
    const auto views = ConvMainloop::load_init(problem, params);
    const auto& a = cute::get<0>(views);
    const auto& b = cute::get<1>(views);
    return cute::make_tuple(cute::make_identity_tensor(cute::append(cute::shape(a), cute::_1{})),
                            cute::make_identity_tensor(cute::append(cute::shape(b), cute::_1{})), a, b);
  }
  template <typename Inputs, typename BlockCoord, typename KTileIterator>
  CUTLASS_DEVICE void load(const Params& params, typename ConvMainloop::MainloopPipeline pipeline,
                           typename ConvMainloop::PipelineState state, const Inputs& inputs,
                           const BlockCoord& block, KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, typename ConvMainloop::TensorStorage& shared_tensors) {
    ConvMainloop::load(params, pipeline, state, cute::make_tuple(cute::get<2>(inputs), cute::get<3>(inputs)), block,
                       k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
  }
};

template <typename Element, typename Activations, typename TileShape>
struct PingpongFpropFor {
  static constexpr int kAlignment = 16 / sizeof(Element);
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment, cutlass::epilogue::TmaWarpSpecialized,
      ConvEpilogue<Element, Activations, TileShape, kAlignment>>::CollectiveOp;
  using ConvMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, Element,
      cutlass::layout::TensorNHWC, kAlignment, Element, cutlass::layout::TensorNHWC, kAlignment, float, TileShape,
      Cluster, MainloopStages<0, CollectiveEpilogue>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Mainloop = PingpongConvMainloop<ConvMainloop>;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<typename Mainloop::GemmProblem, Mainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <typename Element, typename Activations, typename TileShape>
void fprop_pingpong(const ForwardArgs& args, cudaStream_t stream) {
  if (!Activations::has(args.act)) {
    throw std::logic_error("cutlass_sm90: the forward instantiation picked lacks the activation asked for");
  }
  using For = PingpongFpropFor<Element, Activations, TileShape>;
  using Gemm = typename For::Gemm;
  using Kernel = typename Gemm::GemmKernel;
  const auto problem = problem_shape<typename For::Mainloop::ConvProblem>(args.shape);
  const Shape& s = args.shape;
  const int m = static_cast<int>(s.n * s.p * s.q), n = static_cast<int>(s.k);
  const auto stride_y = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(m, n, 1));
  const Element* residual = static_cast<const Element*>(args.residual);
  typename Gemm::Arguments arguments{};
  arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  arguments.problem_shape = For::Mainloop::gemm_problem(problem);
  arguments.mainloop.ptr_A = static_cast<const Element*>(args.x);
  arguments.mainloop.ptr_B = static_cast<const Element*>(args.w);
  arguments.mainloop.problem = problem;
  // Without a residual it is never read (beta 0), but its TMA descriptor is still built: y stands in.
  arguments.epilogue.ptr_C = residual != nullptr ? residual : static_cast<const Element*>(args.y);
  arguments.epilogue.dC = stride_y;
  arguments.epilogue.ptr_D = static_cast<Element*>(args.y);
  arguments.epilogue.dD = stride_y;
  arguments.hw_info = hardware_info();
  set_epilogue_arguments<Element>(arguments.epilogue.thread, args);
  if (programmatic_launch()) return launch<Gemm, true>(arguments, stream);
  launch<Gemm>(arguments, stream);
}

}  // namespace ge2::conv2d::cutlass_sm90
