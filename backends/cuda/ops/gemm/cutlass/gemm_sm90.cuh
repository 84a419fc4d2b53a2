// The cutlass_sm90 candidate's kernel, instantiated once per (dtype, activation) in its own translation unit
// (gemm_sm90_<dtype>_<act>.cu) so the slow CUTLASS instantiations compile in parallel:
//   D = act(alpha * A @ B + beta * C + bias[col])
// A (M x K), B (K x N), C and D (M x N) row-major; float32 accumulation; Hopper's warp-specialized persistent
// kernel (TMA loads into a multi-stage pipeline, wgmma, cooperative schedule) with the epilogue fused through
// CUTLASS's epilogue visitor tree LinCombPerColBiasEltAct (bias broadcast down the rows, a null bias reads as 0).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "cutlass_sm90.hpp"

namespace ge2::gemm::cutlass_sm90 {

// The kernel for one tile shape and schedule (see TileConfig in cutlass_sm90.hpp).
template <typename Element, template <class> class Activation, typename TileShape, typename KernelSchedule,
          typename EpilogueSchedule>
struct GemmFor {
  using Layout = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 16 / sizeof(Element);
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Activation, Element, float, Element, Element,
                                                                    float>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, Layout, kAlignment, Element, Layout,
      kAlignment, EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, Layout, kAlignment, Element, Layout, kAlignment,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <typename Gemm>
void launch_one(const Problem& problem, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  const int m = static_cast<int>(problem.m), n = static_cast<int>(problem.n), k = static_cast<int>(problem.k);
  using ElementA = typename Kernel::ElementA;
  using ElementC = typename Kernel::ElementC;
  using ElementD = typename Kernel::ElementD;
  // Packed row-major strides in CuTe's (rows, columns, batch) order: A is M x K (K contiguous), B is seen as N x K
  // with N contiguous, C and D are M x N (N contiguous).
  typename Kernel::StrideA stride_a = cute::make_stride(int64_t(k), cute::Int<1>{}, int64_t(m) * k);
  typename Kernel::StrideB stride_b = cute::make_stride(cute::Int<1>{}, int64_t(n), int64_t(n) * k);
  typename Kernel::StrideC stride_c = cute::make_stride(int64_t(n), cute::Int<1>{}, int64_t(m) * n);
  typename Kernel::StrideD stride_d = stride_c;
  int device = 0;
  cudaGetDevice(&device);
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
      // Without a residual C is never read (beta 0), but its TMA descriptor is still built: D stands in for it.
      {{}, static_cast<const ElementC*>(problem.c != nullptr ? problem.c : problem.y), stride_c,
       static_cast<ElementD*>(problem.y), stride_d},
      hardware};
  auto& fusion = arguments.epilogue.thread;
  fusion.alpha = problem.alpha;
  fusion.beta = problem.c != nullptr ? problem.beta : 0.0f;
  fusion.bias_ptr = static_cast<const ElementC*>(problem.bias);
  Gemm gemm;
  if (gemm.can_implement(arguments) != cutlass::Status::kSuccess) {
    throw std::invalid_argument("kernel: 'cutlass_sm90' cannot run this problem: CUTLASS can_implement refused it "
                                "(alignment or shape)");
  }
  if (Gemm::get_workspace_size(arguments) != 0) {
    throw std::logic_error("cutlass_sm90: the data-parallel persistent schedule needs no workspace");
  }
  cutlass::Status status = gemm.initialize(arguments, nullptr, stream);
  if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("ge2 op 'gemm': cutlass_sm90 failed: ") + cutlassGetStatusString(status));
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("ge2 op 'gemm': cutlass_sm90 launch: ") + cudaGetErrorString(error));
  }
}

using Cooperative128x128 = cute::Shape<cute::_128, cute::_128, cute::_64>;
using Pingpong64x128 = cute::Shape<cute::_64, cute::_128, cute::_64>;

// Runs `problem` with the tile configuration the table picked.
template <typename Element, template <class> class Activation>
void launch(const Problem& problem, TileConfig config, cudaStream_t stream) {
  namespace schedule = cutlass::gemm;
  namespace epilogue = cutlass::epilogue;
  switch (config) {
    case TileConfig::Cooperative128x128:
      launch_one<typename GemmFor<Element, Activation, Cooperative128x128,
                                  schedule::KernelTmaWarpSpecializedCooperative,
                                  epilogue::TmaWarpSpecializedCooperative>::Gemm>(problem, stream);
      return;
    case TileConfig::Pingpong64x128:
      launch_one<typename GemmFor<Element, Activation, Pingpong64x128, schedule::KernelTmaWarpSpecializedPingpong,
                                  epilogue::TmaWarpSpecialized>::Gemm>(problem, stream);
      return;
  }
  throw std::logic_error("cutlass_sm90: unknown tile configuration");
}

}  // namespace ge2::gemm::cutlass_sm90
