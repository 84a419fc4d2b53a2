// The cutlass_sm90 conv2d kernels, each instantiated in a translation unit of its own
// (conv_sm90_fprop_<tile>_<dtype>_<family>.cu, conv_sm90_<dgrad|wgrad>_<dtype>.cu) so the slow CUTLASS instantiations
// compile in parallel: NHWC implicit GEMM on CUTLASS 3.x's sm90 conv collective (the "activation" read by TMA in
// im2col mode, the other operand by tiled TMA, both into a multi-stage shared-memory pipeline feeding wgmma, float32
// accumulation, a producer warp and a consumer warpgroup). The forward (M = N*P*Q output pixels, N = K filters,
// reduction C*R*S) fuses GE2's whole epilogue through an epilogue visitor tree:
//   y = clip(act(acc + bias[k] + residual)), computed in float32 and rounded to y's dtype once.
// The activation and the clip are one visitor node whose arguments say which (GE2's own apply_act and clip_value, so
// the numbers are the other candidates'). One instantiation serves a family of activations (ActivationAndClip), the
// bias (a null bias reads as 0) and the residual (not read while its beta is 0).
#pragma once
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

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
// clip(act(beta * residual + (acc + bias[k]))): beta is 1 with a residual, 0 (its load skipped) without.
template <typename Element, typename Activations, typename TileShape, int kAlignment>
using ConvEpilogue = evt::Sm90EVT<
    evt::Sm90Compute<Activations::template Fn, Element, float, kRound>,               // clip(act(...))
    evt::Sm90EVT<evt::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,  // beta * residual + ...
        evt::Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>>,     // beta
        evt::Sm90SrcFetch<Element>,                                                      // residual
        evt::Sm90EVT<evt::Sm90Compute<cutlass::plus, float, float, kRound>,              // acc + bias
            evt::Sm90AccFetch,
            evt::Sm90RowBroadcast<0, TileShape, Element, float, cute::Stride<cute::_0, cute::_1, int64_t>,
                                  kAlignment>>>>;  // bias[k], along the GEMM's N

// The forward kernel for one tile shape: the builders pick the stage count from the shared memory the epilogue
// leaves (CUTLASS 4.2's sm90 conv mainloop has the non-persistent warp-specialized schedule only).
template <typename Element, typename Activations, typename TileShape, typename ClusterShape>
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
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
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

template <typename Conv>
void launch(const typename Conv::Arguments& arguments, cudaStream_t stream) {
  Conv conv;
  if (conv.can_implement(arguments) != cutlass::Status::kSuccess) {
    throw std::invalid_argument("kernel: 'cutlass_sm90' cannot run this problem: CUTLASS's can_implement refused it "
                                "(TMA alignment, im2col corner or filter offset limits)");
  }
  if (Conv::get_workspace_size(arguments) != 0) {
    throw std::logic_error("cutlass_sm90: the non-persistent conv kernels need no workspace");
  }
  cutlass::Status status = conv.initialize(arguments, nullptr, stream);
  if (status == cutlass::Status::kSuccess) status = conv.run(stream);
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("ge2 op 'conv2d': cutlass_sm90 failed: ") + cutlassGetStatusString(status));
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("ge2 op 'conv2d': cutlass_sm90 launch: ") + cudaGetErrorString(error));
  }
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
  const float beta = residual != nullptr ? 1.0f : 0.0f;
  // The tree's arguments, children first then the node's own, in the order of ConvEpilogue.
  arguments.epilogue.thread = {
      {                                                                       // beta * residual + (acc + bias)
       {{beta}},                                                              // beta
       {},                                                                    // residual
       {{}, {static_cast<const Element*>(args.bias), Element(0), {}}, {}},   // acc + bias
       {}},
      {args.act, args.slope, args.clip_low, args.clip_high}};                 // clip(act(...))
  launch<Conv>(arguments, stream);
}

// 128 x kTileN output tiles (pixels x filters) of 64-channel reduction steps, one CTA per cluster, for an
// activation of the family Activations.
template <typename Element, int kTileN, typename Activations>
void fprop(const ForwardArgs& args, cudaStream_t stream) {
  if (!Activations::has(args.act)) {
    throw std::logic_error("cutlass_sm90: the forward instantiation picked lacks the activation asked for");
  }
  using cute::_1;
  using cute::_64;
  using cute::_128;
  using TileShape = cute::Shape<_128, cute::Int<kTileN>, cute::Shape<_64>>;
  run_fprop<typename FpropFor<Element, Activations, TileShape, cute::Shape<_1, _1, _1>>::Conv>(args, stream);
}

// The backward passes with a plain epilogue (D = acc, rounded once; no source tensor): dgrad writes dx [N,H,W,C]
// from dy and w (M = N*H*W, N = C, reduction K*R*S), wgrad writes dw [K,R,S,C] from dy and x (M = K, N = R*S*C,
// reduction N*P*Q, which this non-persistent schedule runs in one CTA per output tile: no split-K).
template <typename Element, cutlass::conv::Operator kOp, typename TileShape, typename EpilogueSchedule>
struct GradFor {
  static constexpr int kAlignment = 16 / sizeof(Element);
  using Layout = cutlass::layout::TensorNHWC;
  using OutputLayout =
      cute::conditional_t<kOp == cutlass::conv::Operator::kWgrad, cutlass::layout::TensorKCSR, Layout>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, OutputLayout, kAlignment, Element,
      OutputLayout, kAlignment, EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, Element, Layout, kAlignment, Element, Layout,
      kAlignment, float, TileShape, Cluster,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<kOp, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

template <typename Conv>
void run_grad(const Shape& shape, const void* a, const void* b, void* d, cudaStream_t stream) {
  using Kernel = typename Conv::ConvKernel;
  using Element = typename Kernel::ElementA;
  using ProblemShape = typename Kernel::ProblemShape;
  const auto problem = problem_shape<ProblemShape>(shape);
  typename Kernel::StrideD stride_d{};
  if constexpr (ProblemShape::ConvOp == cutlass::conv::Operator::kWgrad) {
    stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, problem.shape_C, problem.stride_C,
                                                ProblemShape::ConvOp);
  } else {
    stride_d = activation_stride<Kernel>(problem);
  }
  typename Conv::Arguments arguments{
      problem,
      {static_cast<const Element*>(a), static_cast<const Element*>(b)},
      {{}, nullptr, stride_d, static_cast<Element*>(d), stride_d},
      hardware_info()};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  launch<Conv>(arguments, stream);
}

template <typename Element>
void dgrad(const BackwardArgs& args, cudaStream_t stream) {
  using cute::_64;
  using cute::_128;
  using Grad = GradFor<Element, cutlass::conv::Operator::kDgrad, cute::Shape<_128, _128, cute::Shape<_64>>,
                       cutlass::epilogue::TmaWarpSpecialized>;
  run_grad<typename Grad::Conv>(args.shape, args.dy, args.w, args.dx, stream);
}

template <typename Element>
void wgrad(const BackwardArgs& args, cudaStream_t stream) {
  using cute::_64;
  using cute::_128;
  using Grad = GradFor<Element, cutlass::conv::Operator::kWgrad,
                       cute::Shape<_64, cute::Shape<_128>, cute::Shape<_64>>,
                       cutlass::epilogue::NoSmemWarpSpecialized>;
  run_grad<typename Grad::Conv>(args.shape, args.dy, args.x, args.dw, stream);
}

}  // namespace ge2::conv2d::cutlass_sm90
