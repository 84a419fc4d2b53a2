// The cutlass_sm90 conv2d kernels, each instantiated in a translation unit of its own
// (conv_sm90_fprop_<tile>_<dtype>_<family>.cu, conv_sm90_dgrad_<tile>_<dtype>.cu, conv_sm90_wgrad[_sliced]_<dtype>.cu)
// so the slow CUTLASS instantiations compile in parallel: NHWC implicit GEMM on CUTLASS 3.x's sm90 conv collective
// (the "activation" read by TMA in im2col mode, the other operand by tiled TMA, both into a multi-stage shared-memory
// pipeline feeding wgmma, float32 accumulation, a producer warp and a consumer warpgroup). The forward (M = N*P*Q
// output pixels, N = K filters, reduction C*R*S) fuses GE2's whole epilogue through an epilogue visitor tree:
//   y = clip(act(acc + bias[k] + residual)), computed in float32 and rounded to y's dtype once.
// The activation and the clip are one visitor node whose arguments say which (GE2's own apply_act and clip_value, so
// the numbers are the other candidates'). One instantiation serves a family of activations (ActivationAndClip), the
// bias (a null bias reads as 0) and the residual (not read while its beta is 0).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"  // before the conv collectives, which use it without including it
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "conv_sm90.hpp"

namespace ge2::conv2d::cutlass_sm90 {

// The epilogue's last node: clip(act(z)) with the activation (one of the family kMembers), its slope and the clip
// bounds as run-time arguments. The activation is tested once per fragment and each member's fragment loop is
// compiled with its activation known: the epilogue is unrolled over a thread's 64 or 128 accumulators, and a switch
// per element put jump tables and every activation's code at each of them (a 128 x 128 kernel of 22,300 SASS
// instructions, 4,400 now for the piecewise-linear family), a fixed cost that dominated the forward.
template <Act... kMembers>
struct ActivationAndClip {
  static constexpr bool has(Act act) { return ((act == kMembers) || ...); }
  struct Arguments {
    Act act = Act::None;
    float slope = 0.01f;
    float clip_low = -std::numeric_limits<float>::infinity();
    float clip_high = std::numeric_limits<float>::infinity();
  };
  // Sm90Compute reads the arguments' type from Fn<float> and calls Fn<Array<float, N>> on each fragment.
  template <typename T>
  struct Fn {
    using Arguments = ActivationAndClip::Arguments;
  };
  template <typename T, int N>
  struct Fn<cutlass::Array<T, N>> {
    using Arguments = ActivationAndClip::Arguments;
    template <Act kAct>
    CUTLASS_DEVICE static bool apply(cutlass::Array<T, N> const& z, Arguments const& arguments,
                                     cutlass::Array<T, N>& y) {
      if (arguments.act != kAct) return false;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) {
        y[i] = clip_value(apply_act(kAct, z[i], arguments.slope), arguments.clip_low, arguments.clip_high);
      }
      return true;
    }
    CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& z, Arguments const& arguments) const {
      cutlass::Array<T, N> y;
      (void)(apply<kMembers>(z, arguments, y) || ...);  // fprop() runs only an activation of the family
      return y;
    }
  };
};
// The two families, one instantiation each per tile and dtype.
using PiecewiseLinearActivations = ActivationAndClip<Act::None, Act::Relu, Act::LeakyRelu>;
using SmoothActivations = ActivationAndClip<Act::Gelu, Act::Silu>;

namespace evt = cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
// The bias bias[k] along the GEMM's N (y's columns: filters) or, for a transposed GEMM (filters along M), along M.
template <typename Element, typename TileShape, int kAlignment>
using BiasAlongN =
    evt::Sm90RowBroadcast<0, TileShape, Element, float, cute::Stride<cute::_0, cute::_1, int64_t>, kAlignment>;
template <typename Element, typename TileShape, int kAlignment>
using BiasAlongM =
    evt::Sm90ColBroadcast<0, TileShape, Element, float, cute::Stride<cute::_1, cute::_0, int64_t>, kAlignment>;
// clip(act(beta * residual + (acc + bias[k]))): beta is 1 with a residual, 0 (its load skipped) without.
template <typename Element, typename Activations, typename TileShape, int kAlignment,
          typename Bias = BiasAlongN<Element, TileShape, kAlignment>>
using ConvEpilogue = evt::Sm90EVT<
    evt::Sm90Compute<Activations::template Fn, Element, float, kRound>,               // clip(act(...))
    evt::Sm90EVT<evt::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,  // beta * residual + ...
        evt::Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>>,     // beta
        evt::Sm90SrcFetch<Element>,                                                      // residual
        evt::Sm90EVT<evt::Sm90Compute<cutlass::plus, float, float, kRound>,              // acc + bias
            evt::Sm90AccFetch, Bias>>>;

// A mainloop's pipeline stages: kStages, or for 0 as many as fit in the shared memory the epilogue leaves (one CTA
// per SM). The mainloop and the epilogue share their shared memory (CUTLASS 4.2's sm90 conv mainloop has the
// non-persistent warp-specialized schedule only), so 4 stages of 128 x 64 tiles (96 KB) leave room for two CTAs
// per SM: one's prologue and epilogue run under the other's mainloop.
template <int kStages, typename CollectiveEpilogue>
using MainloopStages =
    cute::conditional_t<(kStages > 0), cutlass::conv::collective::StageCount<(kStages > 0 ? kStages : 1)>,
                        cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
                            sizeof(typename CollectiveEpilogue::SharedStorage))>>;

// The forward kernel for one tile shape and stage count (MainloopStages).
template <typename Element, typename Activations, typename TileShape, typename ClusterShape, int kStages>
struct FpropFor {
  static constexpr int kAlignment = 16 / sizeof(Element);  // 16-byte TMA rows: C and K multiples of 8
  using Layout = cutlass::layout::TensorNHWC;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, Layout, kAlignment, Element, Layout,
      kAlignment, cutlass::epilogue::TmaWarpSpecialized,
      ConvEpilogue<Element, Activations, TileShape, kAlignment>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, Element, Layout,
      kAlignment, Element, Layout, kAlignment, float, TileShape, ClusterShape,
      MainloopStages<kStages, CollectiveEpilogue>, cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

// conv2d's problem as CUTLASS's (x [N,H,W,C] is the "activation", w [K,R,S,C] the filter, for every pass); the
// bottom and right padding are the least that give conv2d's P and Q.
template <typename ProblemShape>
ProblemShape problem_shape(const Shape& s) {
  const int pad_bottom = far_padding(s.p, s.h, s.r, s.stride_h, s.dilation_h, s.pad_top);
  const int pad_right = far_padding(s.q, s.w, s.s, s.stride_w, s.dilation_w, s.pad_left);
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, {i(s.n), i(s.h), i(s.w), i(s.c)},
                       {i(s.k), i(s.r), i(s.s), i(s.c)}, {i(s.pad_top), i(s.pad_left)}, {pad_bottom, pad_right},
                       {i(s.stride_h), i(s.stride_w)}, {i(s.dilation_h), i(s.dilation_w)}, 1);
  const auto& output = ProblemShape::ConvOp == cutlass::conv::Operator::kFprop ? problem.shape_C : problem.shape_A;
  if (output[1] != s.p || output[2] != s.q) {
    throw std::logic_error("cutlass_sm90: CUTLASS's output size " + std::to_string(output[1]) + "x" +
                           std::to_string(output[2]) + " differs from conv2d's " + std::to_string(s.p) + "x" +
                           std::to_string(s.q));
  }
  return problem;
}

// The epilogue's strides of an NHWC tensor (y for fprop, dx for dgrad): CuTe's M mode is (W, H, N) of it, so its
// strides are (C, W*C, H*W*C) for a packed [N, H, W, C].
template <typename Kernel, typename ProblemShape>
typename Kernel::StrideC activation_stride(const ProblemShape& problem) {
  typename Kernel::StrideC stride{};
  cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideC{})>{}, [&](auto i) {
    cute::get<0, i>(stride) = problem.stride_C[ProblemShape::RankT - 2 - i];
  });
  return stride;
}

inline cutlass::KernelHardwareInfo hardware_info() {
  int device = 0;
  cudaGetDevice(&device);
  static thread_local int cached_device = -1, cached_sms = 0;  // the SM count query is slow: once per device
  if (cached_device != device) {
    cached_sms = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    cached_device = device;
  }
  return {device, cached_sms};
}

// Whether the persistent ping-pong kernels (the 1x1 GEMM, conv_sm90_pingpong.cuh) run as programmatic dependent
// launches: yes unless GE2_CUTLASS_SM90_PDL=0 (read per launch). They are compiled with CUTLASS's grid dependency
// control: each waits for the grid before it to finish (griddepcontrol.wait) before its first global load and lets
// the next one launch when its last tiles start, so its CTAs start and run their prologue (barriers, TMA descriptor
// prefetch, scheduler) under the previous kernel's tail instead of after it.
inline bool programmatic_launch() {
  const char* value = std::getenv("GE2_CUTLASS_SM90_PDL");
  if (value == nullptr || *value == '\0' || std::string(value) == "1") return true;
  if (std::string(value) == "0") return false;
  throw std::invalid_argument(std::string("GE2_CUTLASS_SM90_PDL: expected 0 or 1, got '") + value + "'");
}

// Runs a CUTLASS device adapter: a conv kernel's, or conv_sm90_1x1.cuh's GEMM's; kProgrammatic (a GEMM compiled with
// CUTLASS_ENABLE_GDC_FOR_SM90 only) launches it as a programmatic dependent launch.
template <typename Conv, bool kProgrammatic = false>
void launch(const typename Conv::Arguments& arguments, cudaStream_t stream) {
  Conv conv;
  if (conv.can_implement(arguments) != cutlass::Status::kSuccess) {
    throw std::invalid_argument("kernel: 'cutlass_sm90' cannot run this problem: CUTLASS's can_implement refused it "
                                "(TMA alignment, im2col corner or filter offset limits)");
  }
  if (Conv::get_workspace_size(arguments) != 0) {
    throw std::logic_error("cutlass_sm90: the conv kernels and the data-parallel persistent GEMM need no workspace");
  }
  cutlass::Status status = conv.initialize(arguments, nullptr, stream);
  if (status == cutlass::Status::kSuccess) {
    if constexpr (kProgrammatic) {
      status = conv.run(stream, nullptr, /*launch_with_pdl=*/true);
    } else {
      status = conv.run(stream);
    }
  }
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("ge2 op 'conv2d': cutlass_sm90 failed: ") + cutlassGetStatusString(status));
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("ge2 op 'conv2d': cutlass_sm90 launch: ") + cudaGetErrorString(error));
  }
}

// The forward's epilogue arguments (ConvEpilogue's tree, children first then the node's own) for `args`: beta 1 with
// a residual, 0 (its load skipped) without.
template <typename Element, typename ThreadArguments>
void set_epilogue_arguments(ThreadArguments& thread, const ForwardArgs& args) {
  thread = {
      {                                                                       // beta * residual + (acc + bias)
       {{args.residual != nullptr ? 1.0f : 0.0f}},                           // beta
       {},                                                                    // residual
       {{}, {static_cast<const Element*>(args.bias), Element(0), {}}, {}},   // acc + bias
       {}},
      {args.act, args.slope, args.clip_low, args.clip_high}};                 // clip(act(...))
}

template <typename Conv>
void run_fprop(const ForwardArgs& args, cudaStream_t stream) {
  using Kernel = typename Conv::ConvKernel;
  using Element = typename Kernel::ElementA;
  const auto problem = problem_shape<typename Kernel::ProblemShape>(args.shape);
  const auto stride_y = activation_stride<Kernel>(problem);  // y and the residual: packed [N, P, Q, K]
  const Element* residual = static_cast<const Element*>(args.residual);
  typename Conv::Arguments arguments{
      problem,
      {static_cast<const Element*>(args.x), static_cast<const Element*>(args.w)},
      // Without a residual it is never read (beta 0), but its TMA descriptor is still built: y stands in.
      {{}, residual != nullptr ? residual : static_cast<const Element*>(args.y), stride_y,
       static_cast<Element*>(args.y), stride_y},
      hardware_info()};
  set_epilogue_arguments<Element>(arguments.epilogue.thread, args);
  launch<Conv>(arguments, stream);
}

// 128 x kTileN output tiles (pixels x filters) of 64-channel reduction steps, one CTA per cluster, for an
// activation of the family Activations: with as many stages as fit, except 128 x 64 tiles of the piecewise-linear
// family with 4 (115 registers: two CTAs per SM; with 8 stages, one, the forward of C64 H56 K64 3x3 at N = 32 took
// 34 us against cuDNN's 24 on the H200, and dgrad's 128 x 64 tiles ran 14-17% faster at 4 stages than 128 x 128 ones
// at 6 on 1x1 layers). The smooth family's epilogue takes 152 registers: one CTA per SM whatever the stages.
template <typename Element, int kTileN, typename Activations>
void fprop(const ForwardArgs& args, cudaStream_t stream) {
  if (!Activations::has(args.act)) {
    throw std::logic_error("cutlass_sm90: the forward instantiation picked lacks the activation asked for");
  }
  using cute::_1;
  using cute::_64;
  using cute::_128;
  using TileShape = cute::Shape<_128, cute::Int<kTileN>, cute::Shape<_64>>;
  constexpr int kStages = kTileN == 64 && std::is_same_v<Activations, PiecewiseLinearActivations> ? 4 : 0;
  run_fprop<typename FpropFor<Element, Activations, TileShape, cute::Shape<_1, _1, _1>, kStages>::Conv>(args, stream);
}

// The backward passes with a plain epilogue (D = acc, rounded once to ElementD; no source tensor): dgrad writes dx
// [N,H,W,C] from dy and w (M = N*H*W, N = C, reduction K*R*S), wgrad writes dw [K,R,S,C] from dy and x (M = K,
// N = (C, S, R), reduction N*P*Q: one CTA per output tile, or per tile and slice with SlicedWgrad below).
// kStages: MainloopStages.
template <typename Element, cutlass::conv::Operator kOp, typename TileShape, typename EpilogueSchedule,
          typename ElementD = Element, int kStages = 0>
struct GradFor {
  static constexpr int kAlignment = 16 / sizeof(Element);
  static constexpr int kAlignmentD = 16 / sizeof(ElementD);
  using Layout = cutlass::layout::TensorNHWC;
  using OutputLayout =
      cute::conditional_t<kOp == cutlass::conv::Operator::kWgrad, cutlass::layout::TensorKCSR, Layout>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, OutputLayout, kAlignmentD, ElementD,
      OutputLayout, kAlignmentD, EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, Element, Layout, kAlignment, Element, Layout,
      kAlignment, float, TileShape, Cluster, MainloopStages<kStages, CollectiveEpilogue>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<kOp, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

template <typename Conv>
typename Conv::Arguments grad_arguments(const Shape& shape, const void* a, const void* b, void* d) {
  using Kernel = typename Conv::ConvKernel;
  using ElementA = typename Kernel::ElementA;
  using ProblemShape = typename Kernel::ProblemShape;
  const auto problem = problem_shape<ProblemShape>(shape);
  typename Kernel::StrideD stride_d{};
  if constexpr (ProblemShape::ConvOp == cutlass::conv::Operator::kWgrad) {
    stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, problem.shape_C, problem.stride_C,
                                                ProblemShape::ConvOp);
  } else {
    stride_d = activation_stride<Kernel>(problem);
  }
  typename Conv::Arguments arguments{};  // member by member: SlicedWgrad's collectives add fields to theirs
  arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  arguments.problem_shape = problem;
  arguments.mainloop.ptr_A = static_cast<const ElementA*>(a);
  arguments.mainloop.ptr_B = static_cast<const ElementA*>(b);
  arguments.epilogue.ptr_C = nullptr;
  arguments.epilogue.dC = stride_d;
  arguments.epilogue.ptr_D = static_cast<typename Kernel::ElementD*>(d);
  arguments.epilogue.dD = stride_d;
  arguments.hw_info = hardware_info();
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  return arguments;
}

template <typename Conv>
void run_grad(const Shape& shape, const void* a, const void* b, void* d, cudaStream_t stream) {
  launch<Conv>(grad_arguments<Conv>(shape, a, b, d), stream);
}

// wgrad's tile (conv_sm90.hpp): filters x channels (CUTLASS tiles the GEMM's N = (C, S, R) along C) x pixels.
using WgradTileShape = cute::Shape<cute::Int<kWgradTileFilters>, cute::Shape<cute::Int<kWgradTileChannels>>,
                                   cute::Shape<cute::Int<kWgradTilePixels>>>;

// A mainloop's tiled view (BLK, BLK_K, tiles, k tiles) of an operand cut to its first `count` k tiles. The im2col
// operand's view is a composed layout (CuTe's im2col map after the tiling): its tiling is the inner layout.
template <typename Layout>
CUTLASS_DEVICE auto first_k_tiles(const Layout& layout, int count) {
  if constexpr (cute::is_composed_layout<Layout>::value) {
    return cute::ComposedLayout{layout.layout_a(), layout.offset(), first_k_tiles(layout.layout_b(), count)};
  } else {
    // The k tile mode has one (dynamic) extent: the linearized N*P*Q over 64.
    const auto k_tiles = cute::transform_leaf(cute::shape<3>(layout), [count](auto) { return count; });
    return cute::make_layout(cute::layout<0>(layout), cute::layout<1>(layout), cute::layout<2>(layout),
                             cute::make_layout(k_tiles, cute::stride<3>(layout)));
  }
}

// The k tiles [begin, begin + count) of a mainloop's tiled view of an operand.
template <typename Tiles>
CUTLASS_DEVICE auto k_tile_range(const Tiles& tiles, int begin, int count) {
  const auto shifted = cute::domain_offset(cute::make_coord(0, 0, 0, begin), tiles);
  return cute::make_tensor(shifted.data(), first_k_tiles(shifted.layout(), count));
}

// wgrad's mainloop over one slice of the reduction: the CTAs of grid layer blockIdx.z load and multiply the k tiles
// [z * k_tiles_per_slice, (z + 1) * k_tiles_per_slice), the last slice fewer (WgradSlices: none empty, so every CTA
// writes its partial sums). The kernel takes its k tile count from these views, so loads, MMAs and the pipeline's
// drain all see the slice.
template <typename Mainloop>
struct SliceOfReduction : Mainloop {
  struct Arguments : Mainloop::Arguments {
    int k_tiles_per_slice = 0;
  };
  struct Params : Mainloop::Params {
    int k_tiles_per_slice = 0;
  };
  static Params to_underlying_arguments(const typename Mainloop::ProblemShape& problem, const Arguments& arguments,
                                        void* workspace) {
    Params params;
    static_cast<typename Mainloop::Params&>(params) = Mainloop::to_underlying_arguments(problem, arguments, workspace);
    params.k_tiles_per_slice = arguments.k_tiles_per_slice;
    return params;
  }
  template <typename ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(const ProblemShapeMNKL& problem, const Params& params) {
    const auto tiles = Mainloop::load_init(problem, params);
    const int begin = static_cast<int>(blockIdx.z) * params.k_tiles_per_slice;
    const int count = cute::min(params.k_tiles_per_slice, static_cast<int>(cute::size<3>(cute::get<0>(tiles))) - begin);
    return cute::make_tuple(k_tile_range(cute::get<0>(tiles), begin, count),
                            k_tile_range(cute::get<1>(tiles), begin, count));
  }
};

// wgrad's plain epilogue writing grid layer blockIdx.z's partial sums to slice z of the float32 workspace
// [slices, K, R, S, C].
template <typename Epilogue>
struct SliceOutput : Epilogue {
  struct Arguments : Epilogue::Arguments {
    int64_t slice_elements = 0;
  };
  using Params = Arguments;
  template <typename ProblemShape>
  static Params to_underlying_arguments(const ProblemShape&, const Arguments& arguments, void*) {
    return arguments;
  }
  CUTLASS_DEVICE SliceOutput(const Params& params, typename Epilogue::TensorStorage& shared_tensors)
      : Epilogue(at_slice(params), shared_tensors) {}

 private:
  CUTLASS_DEVICE static typename Epilogue::Params at_slice(const Params& params) {
    typename Epilogue::Params slice = params;
    slice.ptr_D += static_cast<int64_t>(blockIdx.z) * params.slice_elements;
    return slice;
  }
};

// wgrad with its reduction in slices: CUTLASS's kernel on the two wrappers above, launched with one grid layer per
// slice.
template <typename Element>
struct SlicedWgrad {
  using Grad = GradFor<Element, cutlass::conv::Operator::kWgrad, WgradTileShape,
                       cutlass::epilogue::NoSmemWarpSpecialized, float>;
  using Mainloop = SliceOfReduction<typename Grad::CollectiveMainloop>;
  using Epilogue = SliceOutput<typename Grad::CollectiveEpilogue>;
  using Base = cutlass::conv::kernel::ConvUniversal<typename Grad::ProblemShape, Mainloop, Epilogue>;
  struct Kernel : Base {
    static dim3 get_grid_shape(const typename Base::Params& params) {
      dim3 grid = Base::get_grid_shape(params);
      const int k_tiles = cute::ceil_div(static_cast<int>(cute::get<2>(params.problem_shape)), int(kWgradTilePixels));
      grid.z = cute::ceil_div(k_tiles, params.mainloop.k_tiles_per_slice);
      return grid;
    }
  };
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

// dw = the slices' partial sums added in a fixed order and rounded to dw's dtype once: a block covers 32 groups of
// 4 neighbouring elements (512 contiguous bytes of each slice) with 8 threads each, thread t adding slices t, t + 8,
// ...; the 8 sums of a group are then added in order. Many slices of a small dw (the layers that need slices most)
// are read by many threads at once.
constexpr int kSumGroups = 32, kSumLanes = 8;
template <typename Element>
__global__ void __launch_bounds__(kSumGroups * kSumLanes)
    sum_slices(const float* __restrict__ partial, Element* __restrict__ dw, int64_t elements, int slices) {
  __shared__ float4 sums[kSumLanes][kSumGroups];
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kSumGroups + threadIdx.x) * 4;
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (first < elements) {
#pragma unroll 4
    for (int slice = threadIdx.y; slice < slices; slice += kSumLanes) {
      const float4 part = __ldg(reinterpret_cast<const float4*>(partial + slice * elements + first));
      sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || first >= elements) return;
  for (int lane = 1; lane < kSumLanes; ++lane) {
    const float4 part = sums[lane][threadIdx.x];
    sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
  }
  cutlass::AlignedArray<Element, 4> out;
  out[0] = Element(sum.x), out[1] = Element(sum.y), out[2] = Element(sum.z), out[3] = Element(sum.w);
  *reinterpret_cast<cutlass::AlignedArray<Element, 4>*>(dw + first) = out;
}

// dgrad in 128 x kTileN tiles (pixels x channels) of 64-filter reduction steps: 128 x 128 with as many stages as
// fit (one CTA per SM), or 128 x 64 with 4 stages (96 KB: two CTAs per SM, one's prologue and epilogue under the
// other's mainloop) for few channels or a short reduction (kernels/cutlass_sm90.cu picks).
template <typename Element, int kTileN>
void dgrad(const BackwardArgs& args, cudaStream_t stream) {
  using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::Shape<cute::_64>>;
  using Grad = GradFor<Element, cutlass::conv::Operator::kDgrad, TileShape, cutlass::epilogue::TmaWarpSpecialized,
                       Element, kTileN == 64 ? 4 : 0>;
  run_grad<typename Grad::Conv>(args.shape, args.dy, args.w, args.dx, stream);
}

template <typename Element>
void wgrad(const BackwardArgs& args, cudaStream_t stream) {
  using Grad = GradFor<Element, cutlass::conv::Operator::kWgrad, WgradTileShape,
                       cutlass::epilogue::NoSmemWarpSpecialized>;
  run_grad<typename Grad::Conv>(args.shape, args.dy, args.x, args.dw, stream);
}

template <typename Element>
void wgrad_sliced(const BackwardArgs& args, const WgradSlices& slices, float* workspace, cudaStream_t stream) {
  using Sliced = SlicedWgrad<Element>;
  using Conv = typename Sliced::Conv;
  const Shape& s = args.shape;
  const int64_t dw_elements = s.k * s.r * s.s * s.c;
  // The plan's k tiles must be CUTLASS's: a slice past the reduction's end would write no partial sums.
  const auto problem = problem_shape<typename Sliced::Grad::ProblemShape>(s);
  const int64_t k_tiles =
      cute::ceil_div(int64_t(cute::get<2>(Sliced::Mainloop::get_problem_shape_MNKL(problem))), kWgradTilePixels);
  if (slices.count < 2 || (slices.count - 1) * slices.k_tiles_per_slice >= k_tiles ||
      slices.count * slices.k_tiles_per_slice < k_tiles ||
      slices.workspace_bytes < static_cast<std::size_t>(slices.count * dw_elements) * sizeof(float)) {
    throw std::logic_error("cutlass_sm90: wgrad's slices (" + std::to_string(slices.count) + " of " +
                           std::to_string(slices.k_tiles_per_slice) + " k tiles) do not cover its " +
                           std::to_string(k_tiles) + " k tiles");
  }
  typename Conv::Arguments arguments = grad_arguments<Conv>(s, args.dy, args.x, workspace);
  arguments.mainloop.k_tiles_per_slice = static_cast<int>(slices.k_tiles_per_slice);
  arguments.epilogue.slice_elements = dw_elements;
  launch<Conv>(arguments, stream);
  const dim3 block(kSumGroups, kSumLanes);
  const auto blocks = static_cast<unsigned>(cute::ceil_div(dw_elements, int64_t(4 * kSumGroups)));
  sum_slices<<<blocks, block, 0, stream>>>(workspace, static_cast<Element*>(args.dw), dw_elements, slices.count);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("ge2 op 'conv2d': cutlass_sm90 wgrad's sum of slices launch: ") +
                             cudaGetErrorString(error));
  }
}

}  // namespace ge2::conv2d::cutlass_sm90
