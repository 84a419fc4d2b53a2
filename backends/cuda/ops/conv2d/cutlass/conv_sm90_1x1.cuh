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

// The epilogue without a source operand, for problems without a residual: clip(act(acc + bias[k])). A kernel built on
// it (PointwiseEpilogueKind::NoC: ElementC void) keeps no residual tile in shared memory, so the mainloop gets the
// stages that memory held, and CUTLASS delays each TMA store of y by one epilogue subtile (gemm_sm90.cuh's
// BiasEpilogue does the same for the plain product).
template <typename Element, typename Activations, typename TileShape, int kAlignment,
          typename Bias = BiasAlongN<Element, TileShape, kAlignment>>
using ConvNoCEpilogue = evt::Sm90EVT<
    evt::Sm90Compute<Activations::template Fn, Element, float, kRound>,  // clip(act(...))
    evt::Sm90EVT<evt::Sm90Compute<cutlass::plus, float, float, kRound>,  // acc + bias
        evt::Sm90AccFetch, Bias>>;
// The epilogue of a problem without bias, residual, activation or clip (a plain convolution, as in training, where
// batch norm follows): y = acc, rounded once. The no-C tree's bias broadcast, activation dispatch and clip cost about
// 6 instructions an output element (ncu, session 43: 2.8x the instructions of cuBLAS's nvjet on C128 H28 K512), and
// these layers' tiles spend most of their time in the epilogue; each no-C tile has a twin on it (plain_epilogue):
// C64 H56 K64 8.50 -> 6.26 us, C128 H28 K512 14.80 -> 11.28 us in graph replay (cuDNN 6.33 and 12.89).
template <typename Element>
using PlainEpilogue =
    evt::Sm90EVT<evt::Sm90Compute<cutlass::epilogue::thread::Identity, Element, float, kRound>, evt::Sm90AccFetch>;
inline bool plain_epilogue(const ForwardArgs& args) {
  return args.bias == nullptr && args.residual == nullptr && args.act == Act::None &&
         args.clip_low == -std::numeric_limits<float>::infinity() &&
         args.clip_high == std::numeric_limits<float>::infinity();
}

// A 1x1 tile's epilogue: ConvEpilogue with the residual as its source operand, ConvNoCEpilogue, or PlainEpilogue.
enum class PointwiseEpilogueKind { WithC, NoC, Plain };
template <PointwiseEpilogueKind kKind, typename Element, typename TileShape, int kAlignment, typename Bias>
using PointwiseEpilogue = cute::conditional_t<
    kKind == PointwiseEpilogueKind::WithC,
    ConvEpilogue<Element, PiecewiseLinearActivations, TileShape, kAlignment, Bias>,
    cute::conditional_t<kKind == PointwiseEpilogueKind::NoC,
                        ConvNoCEpilogue<Element, PiecewiseLinearActivations, TileShape, kAlignment, Bias>,
                        PlainEpilogue<Element>>>;
// The epilogue's source operand: the residual's element type, or void (none).
template <PointwiseEpilogueKind kKind, typename Element>
using PointwiseElementC = cute::conditional_t<kKind == PointwiseEpilogueKind::WithC, Element, void>;

template <typename Element, typename TileShape, typename KernelSchedule, typename EpilogueSchedule,
          PointwiseEpilogueKind kKind>
using PointwiseKernelFor = gemm::cutlass_sm90::GemmKernelFor<
    Element, cutlass::layout::ColumnMajor,
    PointwiseEpilogue<kKind, Element, TileShape, 16 / sizeof(Element),
                      BiasAlongN<Element, TileShape, 16 / sizeof(Element)>>,
    TileShape, gemm::cutlass_sm90::Cluster1x1, KernelSchedule, EpilogueSchedule, PointwiseElementC<kKind, Element>>;
template <typename Element, typename TileShape, PointwiseEpilogueKind kKind = PointwiseEpilogueKind::WithC>
using PointwiseGemm = typename PointwiseKernelFor<Element, TileShape, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                                  cutlass::epilogue::TmaWarpSpecialized, kKind>::Gemm;
// Both consumer warpgroups on one tile (M split between them).
template <typename Element, typename TileShape, PointwiseEpilogueKind kKind = PointwiseEpilogueKind::WithC>
using CooperativePointwiseGemm =
    typename PointwiseKernelFor<Element, TileShape, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                cutlass::epilogue::TmaWarpSpecializedCooperative, kKind>::Gemm;

// The GEMM transposed, y^T [K, N*H*W] = w [K, C] x^T, as cuBLAS's nvjet_sm90_hsh_128x192_64x5_1x2_h_bz_coopB_TNN
// runs C512 H28 K128 for PyTorch: filters along M, pixels along N, y column-major (the same memory as NHWC's y), the
// bias along M; cooperative (both warpgroups on a tile), one CTA per cluster (session 38's bench call: cuBLAS's 1 x 2
// cluster lost to one CTA on every ResNet-50 1x1 layer here).
template <typename Element, typename TileShape, PointwiseEpilogueKind kKind = PointwiseEpilogueKind::WithC>
struct TransposedPointwiseGemmFor {
  using ClusterShape = gemm::cutlass_sm90::Cluster1x1;
  static constexpr int kAlignment = 16 / sizeof(Element);
  using Fusion = PointwiseEpilogue<kKind, Element, TileShape, kAlignment, BiasAlongM<Element, TileShape, kAlignment>>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, PointwiseElementC<kKind, Element>,
      cutlass::layout::ColumnMajor, kAlignment, Element, cutlass::layout::ColumnMajor, kAlignment,
      cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlignment, Element,
      cutlass::layout::ColumnMajor, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>>;
};

// The mainloop's pipeline stages of a Gemm (the builder's StageCountAutoCarveout: as many as fit in the shared memory
// the epilogue leaves), checked in each unit by static_assert (the no-C tiles against their siblings with C).
template <typename Gemm>
constexpr int kMainloopStages = Gemm::GemmKernel::CollectiveMainloop::DispatchPolicy::Stages;

// kTransposed: Gemm computes y^T = w x^T (TransposedPointwiseGemmFor), else y = x w^T.
template <typename Gemm, bool kTransposed = false>
void run_pointwise(const ForwardArgs& args, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  using Element = typename Kernel::ElementA;
  constexpr bool kPlain = std::is_same_v<typename Kernel::CollectiveEpilogue::FusionCallbacks, PlainEpilogue<Element>>;
  if (kPlain && !plain_epilogue(args)) {
    throw std::logic_error(
        "cutlass_sm90: a 1x1 GEMM without an epilogue was given a bias, residual, activation or clip");
  }
  const Shape& s = args.shape;
  const int pixels = static_cast<int>(s.n * s.h * s.w), filters = static_cast<int>(s.k);
  const int m = kTransposed ? filters : pixels, n = kTransposed ? pixels : filters, k = static_cast<int>(s.c);
  // Packed strides in CuTe's (rows, reduction or columns, batch) order: x is pixels x C, w is K x C (each K-major),
  // y pixels x K row-major (for the transposed GEMM: K x pixels column-major).
  const auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(m, k, 1));
  const auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(n, k, 1));
  const auto stride_y = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, cute::make_shape(m, n, 1));
  const Element* x = static_cast<const Element*>(args.x);
  const Element* w = static_cast<const Element*>(args.w);
  const Element* residual = static_cast<const Element*>(args.residual);
  using ElementC = typename Kernel::ElementC;  // void: no source operand (ConvNoCEpilogue)
  constexpr bool kHasC = !std::is_void_v<ElementC>;
  if (!kHasC && residual != nullptr) {
    throw std::logic_error("cutlass_sm90: a 1x1 GEMM without a source operand was given a residual");
  }
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {kTransposed ? w : x, stride_a, kTransposed ? x : w, stride_b},
      // Without a residual it is never read (beta 0), but its TMA descriptor is still built: y stands in (none for a
      // kernel without a source operand).
      {{}, static_cast<const ElementC*>(!kHasC ? nullptr : residual != nullptr ? residual
                                                                              : static_cast<const Element*>(args.y)),
       stride_y, static_cast<Element*>(args.y), stride_y},
      hardware_info()};
  if constexpr (kPlain) {
    arguments.epilogue.thread = {};  // y = acc
  } else if constexpr (kHasC) {
    set_epilogue_arguments<Element>(arguments.epilogue.thread, args);
  } else {  // ConvNoCEpilogue's: clip(act(acc + bias))
    arguments.epilogue.thread = {
        {{}, {static_cast<const Element*>(args.bias), Element(0), {}}, {}},  // acc + bias
        {args.act, args.slope, args.clip_low, args.clip_high}};              // clip(act(...))
  }
  if (programmatic_launch()) return launch<Gemm, true>(arguments, stream);
  launch<Gemm>(arguments, stream);
}

// The no-C tiles (float16 only), or for a problem with a residual their twins with C.
template <typename Element>
void fprop_1x1(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream);
template <typename Element>
void fprop_1x1_noc(const ForwardArgs& args, PointwiseTile tile, cudaStream_t stream) {
  const PointwiseTile with_c = twin(tile, false);
  if (args.residual != nullptr && with_c != tile) return fprop_1x1<Element>(args, with_c, stream);
  if constexpr (std::is_same_v<Element, cutlass::half_t>) {
    switch (tile) {
      case PointwiseTile::Pingpong64x128NoC: return fprop_1x1_noc_pingpong_64x128_f16(args, stream);
      case PointwiseTile::Cooperative256x64NoC: return fprop_1x1_noc_cooperative_256x64_f16(args, stream);
      case PointwiseTile::Cooperative256x128NoC: return fprop_1x1_noc_cooperative_256x128_f16(args, stream);
      case PointwiseTile::Transposed128x192NoC: return fprop_1x1_noc_transposed_128x192_f16(args, stream);
      default: break;
    }
  }
  throw std::logic_error("cutlass_sm90: no 1x1 GEMM of this tile for this dtype");
}

// The tiles (output pixels x filters, 64-channel reduction steps; the transposed one filters x pixels, float16 only)
// of PointwiseTile.
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
    case PointwiseTile::Transposed128x192:
      if constexpr (std::is_same_v<Element, cutlass::half_t>) return fprop_1x1_transposed_128x192_f16(args, stream);
      break;
    default:
      return fprop_1x1_noc<Element>(args, tile, stream);
  }
  throw std::logic_error("cutlass_sm90: no 1x1 GEMM of this tile for this dtype");
}

}  // namespace ge2::conv2d::cutlass_sm90
