// The cutlass_sm90 candidate's kernels, instantiated once per (dtype, activation) in its own translation unit
// (gemm_sm90_<dtype>_<act>.cu) so the slow CUTLASS instantiations compile in parallel:
//   D = beta_after * C + act(alpha * A @ B + beta_before * C + bias[col])
// (one of the betas is the problem's beta, the other 0: the residual is added before or after the activation).
// A (M x K), B (K x N), C and D (M x N) row-major; float32 accumulation; Hopper's warp-specialized persistent
// kernels (TMA loads into a multi-stage pipeline, wgmma; cooperative or ping-pong consumer warpgroups; 2-CTA clusters
// multicasting the shared operand's tiles) with the epilogue fused through an epilogue visitor tree (bias broadcast
// down the rows, a null bias reads as 0; C is not read while both betas are 0).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "cutlass/epilogue/thread/activation.h"

#include "cutlass_sm90.hpp"
#include "gemm_sm90_kernel.cuh"

namespace ge2::gemm::cutlass_sm90 {

// The epilogue visitor tree: beta_after * C + act(beta_before * C + (alpha * acc + bias)). Both residual nodes are
// CUTLASS's beta * C + X node, which skips C's TMA load while its beta is 0, so one instantiation serves the plain
// product, the residual before the activation and the residual after it.
namespace evt = cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
using ScalarArgument = evt::Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>>;
template <typename Element, template <class> class Activation, typename TileShape, int kAlignment>
using ResidualBiasActEpilogue = evt::Sm90EVT<
    evt::Sm90Compute<cutlass::homogeneous_multiply_add, Element, float, kRound>,  // beta_after * C + act(...)
    ScalarArgument,                                                                 // beta_after
    evt::Sm90SrcFetch<Element>,                                                     // C
    evt::Sm90EVT<evt::Sm90Compute<Activation, float, float, kRound>,                // act(...)
        evt::Sm90EVT<evt::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,  // beta_before*C + X
            ScalarArgument,                                                                       // beta_before
            evt::Sm90SrcFetch<Element>,                                                           // C
            evt::Sm90EVT<evt::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,  // alpha*acc+bias
                ScalarArgument,                                                                        // alpha
                evt::Sm90AccFetch,                                                                     // acc
                evt::Sm90RowBroadcast<0, TileShape, Element, float, cute::Stride<cute::_0, cute::_1, int64_t>,
                                      kAlignment>>>>>;  // bias[col]

// The kernel for one tile shape, cluster shape and schedule (see TileConfig in cutlass_sm90.hpp).
template <typename Element, template <class> class Activation, typename TileShape, typename ClusterShape,
          typename KernelSchedule, typename EpilogueSchedule>
using GemmFor = GemmKernelFor<Element, cutlass::layout::RowMajor,
                              ResidualBiasActEpilogue<Element, Activation, TileShape, 16 / sizeof(Element)>, TileShape,
                              ClusterShape, KernelSchedule, EpilogueSchedule>;

// The plain product's tree without a source operand: alpha * acc + bias[col]. Kernels built on it (ElementC void:
// no C in shared memory, CUTLASS delays each TMA store by one epilogue subtile) run only problems without a residual.
template <typename Element, typename TileShape, int kAlignment>
using BiasEpilogue = evt::Sm90EVT<
    evt::Sm90Compute<cutlass::homogeneous_multiply_add, Element, float, kRound>,  // alpha * acc + bias
    ScalarArgument,                                                                 // alpha
    evt::Sm90AccFetch,                                                              // acc
    evt::Sm90RowBroadcast<0, TileShape, Element, float, cute::Stride<cute::_0, cute::_1, int64_t>,
                          kAlignment>>;  // bias[col]

template <typename Element, typename TileShape, typename ClusterShape, typename KernelSchedule,
          typename EpilogueSchedule>
using GemmNoCFor =
    GemmKernelFor<Element, cutlass::layout::RowMajor, BiasEpilogue<Element, TileShape, 16 / sizeof(Element)>, TileShape,
                  ClusterShape, KernelSchedule, EpilogueSchedule, void>;

// What a kernel's parameters are built from, besides its type: a call with an equal key may reuse them.
struct ParamsKey {
  const void* a;
  const void* b;
  const void* c;
  const void* bias;
  void* y;
  int64_t m, n, k;
  float alpha, beta_before, beta_after;
  int max_swizzle;
  Raster raster;
  int device;
  bool operator==(const ParamsKey& other) const {
    return a == other.a && b == other.b && c == other.c && bias == other.bias && y == other.y && m == other.m &&
           n == other.n && k == other.k && alpha == other.alpha && beta_before == other.beta_before &&
           beta_after == other.beta_after && max_swizzle == other.max_swizzle && raster == other.raster &&
           device == other.device;
  }
};

// The parameters of the last few problems each kernel ran on this thread. Building them (CUTLASS's
// to_underlying_arguments: one TMA descriptor per operand, each encoded through a driver entry point looked up by
// name, plus the shared memory attribute) is host time on every call; a call that repeats a problem (the same
// pointers, shapes and scalars: a training step, a replayed plan, a benchmark loop) launches with the stored ones.
// Session 36's mid call (H200, host time per call of gemm.forward at 256^3 float16): 14.2 us with the stored
// parameters against 18.1 us building them (cuBLASLt's candidate: 16.3 us); 17.1 against 21.7 us for a 2-CTA
// cluster kernel.
template <typename Params>
struct ParamsCache {
  struct Entry {
    ParamsKey key;
    Params params;
  };
  static constexpr int kEntries = 8;
  Entry entries[kEntries];
  int used = 0, next = 0;

  Params* find(const ParamsKey& key) {
    for (int i = 0; i < used; ++i) {
      if (entries[i].key == key) return &entries[i].params;
    }
    return nullptr;
  }
  void insert(const ParamsKey& key, const Params& params) {  // round robin over the entries
    entries[next] = {key, params};
    next = (next + 1) % kEntries;
    used = used < kEntries ? used + 1 : used;
  }
};

inline void check_launch(cutlass::Status status) {
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("ge2 op 'gemm': cutlass_sm90 failed: ") + cutlassGetStatusString(status));
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("ge2 op 'gemm': cutlass_sm90 launch: ") + cudaGetErrorString(error));
  }
}

template <typename Gemm>
void launch_one(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  int device = 0;
  cudaGetDevice(&device);
  const float beta = problem.c != nullptr ? problem.beta : 0.0f;
  const float beta_before = problem.residual_after_act ? 0.0f : beta;
  const float beta_after = problem.residual_after_act ? beta : 0.0f;
  const ParamsKey key{problem.a,  problem.b,  problem.c,   problem.bias, problem.y,  problem.m,
                      problem.n,  problem.k,  problem.alpha, beta_before, beta_after, schedule.max_swizzle,
                      schedule.raster, device};
  static thread_local ParamsCache<typename Gemm::Params> cache;
  if (typename Gemm::Params* params = cache.find(key)) {
    // initialize() set the kernel's shared memory attribute when these parameters were built on this device
    return check_launch(Gemm::run(*params, stream));
  }
  const int m = static_cast<int>(problem.m), n = static_cast<int>(problem.n), k = static_cast<int>(problem.k);
  using ElementA = typename Kernel::ElementA;
  using ElementC = typename Kernel::ElementC;  // void: the kernel has no source operand (BiasEpilogue)
  using ElementD = typename Kernel::ElementD;
  constexpr bool kHasC = !std::is_void_v<ElementC>;
  if (!kHasC && beta != 0.0f) {
    throw std::logic_error("cutlass_sm90: a kernel without a C operand was given a residual");
  }
  // Packed row-major strides in CuTe's (rows, columns, batch) order: A is M x K (K contiguous), B is seen as N x K
  // with N contiguous, C and D are M x N (N contiguous).
  typename Kernel::StrideA stride_a = cute::make_stride(int64_t(k), cute::Int<1>{}, int64_t(m) * k);
  typename Kernel::StrideB stride_b = cute::make_stride(cute::Int<1>{}, int64_t(n), int64_t(n) * k);
  typename Kernel::StrideC stride_c = cute::make_stride(int64_t(n), cute::Int<1>{}, int64_t(m) * n);
  typename Kernel::StrideD stride_d = stride_c;
  // The SM count query is cached by CUTLASS per device only when asked through KernelHardwareInfo; do it once.
  static thread_local int cached_device = -1, cached_sms = 0;
  if (cached_device != device) {
    cached_sms = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    cached_device = device;
  }
  cutlass::KernelHardwareInfo hardware{device, cached_sms};
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {static_cast<const ElementA*>(problem.a), stride_a, static_cast<const ElementA*>(problem.b), stride_b},
      // Without a residual C is never read (both betas 0), but its TMA descriptor is still built: D stands in.
      {{},
       static_cast<const ElementC*>(!kHasC ? nullptr : problem.c != nullptr ? problem.c : problem.y),
       stride_c, static_cast<ElementD*>(problem.y), stride_d},
      hardware};
  // The tree's arguments, children first then the node's own, in the order of ResidualBiasActEpilogue (or
  // BiasEpilogue; bias is cast in place: nvcc warns of a local used in one branch of an if constexpr only).
  if constexpr (kHasC) {
    arguments.epilogue.thread = {
        {{beta_after}},  // beta_after
        {},              // C
        {                // act(...)
         {                // beta_before * C + (...)
          {{beta_before}},
          {},
          {{{problem.alpha}}, {}, {static_cast<const ElementD*>(problem.bias), ElementD(0), {}}, {}},  // alpha*acc+bias
          {}},
         {}},
        {}};
  } else {  // alpha * acc + bias
    arguments.epilogue.thread = {
        {{problem.alpha}}, {}, {static_cast<const ElementD*>(problem.bias), ElementD(0), {}}, {}};
  }
  arguments.scheduler.max_swizzle_size = schedule.max_swizzle;
  using RasterOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  arguments.scheduler.raster_order = schedule.raster == Raster::AlongM   ? RasterOptions::AlongM
                                     : schedule.raster == Raster::AlongN ? RasterOptions::AlongN
                                                                         : RasterOptions::Heuristic;
  Gemm gemm;
  if (gemm.can_implement(arguments) != cutlass::Status::kSuccess) {
    throw std::invalid_argument("kernel: 'cutlass_sm90' cannot run this problem: CUTLASS can_implement refused it "
                                "(alignment or shape)");
  }
  if (Gemm::get_workspace_size(arguments) != 0) {
    throw std::logic_error("cutlass_sm90: the data-parallel persistent schedule needs no workspace");
  }
  cutlass::Status status = gemm.initialize(arguments, nullptr, stream);
  if (status == cutlass::Status::kSuccess) {
    cache.insert(key, gemm.params());
    status = gemm.run(stream);
  }
  check_launch(status);
}

using cute::_64;
using cute::_128;
using cute::_256;
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CooperativeEpilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingpongEpilogue = cutlass::epilogue::TmaWarpSpecialized;

template <typename Element, template <class> class Activation, typename TileShape, typename ClusterShape,
          typename KernelSchedule, typename EpilogueSchedule>
void launch_config(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_one<typename GemmFor<Element, Activation, TileShape, ClusterShape, KernelSchedule, EpilogueSchedule>::Gemm>(
      problem, schedule, stream);
}

template <typename Element, typename TileShape, typename ClusterShape, typename KernelSchedule,
          typename EpilogueSchedule>
void launch_config_no_c(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_one<typename GemmNoCFor<Element, TileShape, ClusterShape, KernelSchedule, EpilogueSchedule>::Gemm>(
      problem, schedule, stream);
}

// The act-none configurations compiled one translation unit per dtype (gemm_sm90_none_<config>_<dtype>.cu, each
// holding GE2_CUTLASS_SM90_PER_DTYPE(<dtype>, <element>, <config>)): their launchers' bodies, for either dtype.
template <typename Element>
void launch_none_Pingpong128x128Cluster2x1NoC(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  launch_config_no_c<Element, cute::Shape<_128, _128, _64>, Cluster2x1, Pingpong, PingpongEpilogue>(problem, schedule,
                                                                                                    stream);
}
#define GE2_CUTLASS_SM90_PER_DTYPE(dtype_name, element, config)                                                     \
  void ge2::gemm::cutlass_sm90::launch_##dtype_name##_none_##config(const Problem& problem, const Schedule& schedule, \
                                                                    cudaStream_t stream) {                          \
    launch_none_##config<element>(problem, schedule, stream);                                                        \
  }

// A configuration compiled for activation none only, in its own translation units
// (gemm_sm90_none_<config>[_<dtype>].cu); another activation refuses it.
#define GE2_CUTLASS_SM90_ACT_NONE_LAUNCH(config)                                                           \
  if constexpr (!kIs_none) {                                                                               \
    throw std::invalid_argument("GE2_CUTLASS_SM90_TILE: " #config " is compiled for act none only");       \
  } else if constexpr (std::is_same_v<Element, cutlass::half_t>) {                                         \
    return launch_f16_none_##config(problem, schedule, stream);                                            \
  } else {                                                                                                 \
    return launch_bf16_none_##config(problem, schedule, stream);                                           \
  }
#define GE2_CUTLASS_SM90_ACT_NONE_CASE(config) \
  case TileConfig::config:                     \
    GE2_CUTLASS_SM90_ACT_NONE_LAUNCH(config)

// An act-none configuration without a C operand: a problem with a residual runs on `sibling`, the same tiles with C
// (the table gives such problems the activations' choice instead; this serves GE2_CUTLASS_SM90_TILE).
#define GE2_CUTLASS_SM90_NO_C_CASE(no_c_config, sibling)                        \
  case TileConfig::no_c_config:                                                 \
    if (kIs_none && problem.c != nullptr && problem.beta != 0.0f) {             \
      Schedule with_c = schedule;                                               \
      with_c.config = TileConfig::sibling;                                      \
      return launch<Element, Activation>(problem, with_c, stream);              \
    }                                                                           \
    GE2_CUTLASS_SM90_ACT_NONE_LAUNCH(no_c_config)

// Runs `problem` with the tile configuration the table picked (or GE2_CUTLASS_SM90_TILE forced).
template <typename Element, template <class> class Activation>
void launch(const Problem& problem, const Schedule& schedule, cudaStream_t stream) {
  constexpr bool kIs_none = std::is_same_v<Activation<float>, cutlass::epilogue::thread::Identity<float>>;
  switch (schedule.config) {
    case TileConfig::Pingpong64x128:
      return launch_config<Element, Activation, cute::Shape<_64, _128, _64>, Cluster1x1, Pingpong, PingpongEpilogue>(
          problem, schedule, stream);
    case TileConfig::Cooperative128x128:
      return launch_config<Element, Activation, cute::Shape<_128, _128, _64>, Cluster1x1, Cooperative,
                           CooperativeEpilogue>(problem, schedule, stream);
    case TileConfig::Pingpong128x128Cluster2x1:
      return launch_config<Element, Activation, cute::Shape<_128, _128, _64>, Cluster2x1, Pingpong, PingpongEpilogue>(
          problem, schedule, stream);
    case TileConfig::Cooperative128x256Cluster2x1:
      return launch_config<Element, Activation, cute::Shape<_128, _256, _64>, Cluster2x1, Cooperative,
                           CooperativeEpilogue>(problem, schedule, stream);
    GE2_CUTLASS_SM90_ACT_NONE_CASE(Cooperative128x256)
    GE2_CUTLASS_SM90_ACT_NONE_CASE(Pingpong128x128)
    GE2_CUTLASS_SM90_NO_C_CASE(Pingpong128x128Cluster2x1NoC, Pingpong128x128Cluster2x1)
  }
  throw std::logic_error("cutlass_sm90: unknown tile configuration");
}
#undef GE2_CUTLASS_SM90_ACT_NONE_CASE
#undef GE2_CUTLASS_SM90_ACT_NONE_LAUNCH
#undef GE2_CUTLASS_SM90_NO_C_CASE

}  // namespace ge2::gemm::cutlass_sm90
