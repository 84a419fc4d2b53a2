// The flash_sm90 candidate's checks and dispatch (compiled for every architecture, no CUTLASS headers): which
// problems it runs, and which (pass, dtype, head_dim) instantiation in sm90/flash_sm90_*.cu (compiled for sm_90a
// only, when CMake found CUTLASS: GE2_WITH_CUTLASS=1) runs them. The backward runs between flash's row_dot and
// dq_store kernels, in flash's workspace.
#include <cmath>
#include <stdexcept>
#include <string>

#include "api.hpp"
#include "cutlass_build.hpp"
#include "status.hpp"

#if GE2_WITH_CUTLASS
#include "../sm90/flash_sm90.hpp"
#endif

namespace ge2::attention {

std::string flash_sm90_not_built_reason() { return cutlass_not_built_reason(); }

std::string flash_sm90_unsupported_reason(const Shape& s) {
  const std::string not_built = flash_sm90_not_built_reason();
  if (!not_built.empty()) return "flash_sm90 is NOT BUILT: " + not_built;
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256) {
    return "flash_sm90 is built for head_dim 64, 128 and 256, got head_dim " + std::to_string(s.head_dim);
  }
  if (s.dtype != DType::Float16 && s.dtype != DType::BFloat16) {
    return std::string("flash_sm90 runs float16 and bfloat16 on wgmma: got ") + dtype_name(s.dtype);
  }
  if (s.has_bias()) return "flash_sm90 takes no additive bias (cudnn and rowwise do)";
  if (s.has_window()) return "flash_sm90 takes no sliding window (flash, rowwise and unfused do)";
  if (s.softcap > 0.0f) return "flash_sm90 takes no soft cap (flash, rowwise and unfused do)";
  const int capability = current_compute_capability();
  if (capability != 90) {
    return "flash_sm90 needs an sm_90 GPU (built for sm_90a: wgmma and TMA), this device is " +
           (capability < 0 ? std::string("absent") : "sm_" + std::to_string(capability));
  }
  return "";
}

void launch_flash_sm90_forward(const ForwardArgs& args, cudaStream_t stream) {
#if GE2_WITH_CUTLASS
  // The forward folds the scale into each score's exp2, ordering the raw scores by its sign (attention's Python
  // entry points accept finite nonzero scales only; this guards other callers from a silently wrong result).
  if (!(std::isfinite(args.shape.scale) && args.shape.scale != 0.0f)) {
    throw std::invalid_argument("scale: flash_sm90 needs a finite nonzero scale, got " +
                                std::to_string(args.shape.scale));
  }
  using Launch = void (*)(const ForwardArgs&, cudaStream_t);
  const bool half = args.shape.dtype == DType::Float16;
  const int head_dim = args.shape.head_dim;
  const Launch launch = head_dim == 64    ? (half ? flash_sm90::launch_f16_64 : flash_sm90::launch_bf16_64)
                        : head_dim == 128 ? (half ? flash_sm90::launch_f16_128 : flash_sm90::launch_bf16_128)
                                          : (half ? flash_sm90::launch_f16_256 : flash_sm90::launch_bf16_256);
  launch(args, stream);
  GE2_CHECK_LAUNCH("attention flash_sm90 forward");
#else
  (void)args;
  (void)stream;
  throw std::invalid_argument("kernel: flash_sm90 is NOT BUILT: " + flash_sm90_not_built_reason());
#endif
}

void launch_flash_sm90_backward(const BackwardArgs& args, void* workspace, cudaStream_t stream) {
#if GE2_WITH_CUTLASS
  const FlashBackwardWorkspace scratch = flash_backward_workspace(args.shape, workspace);
  launch_flash_backward_row_dot(args, scratch, stream);
  using Launch = void (*)(const BackwardArgs&, const float*, float*, cudaStream_t);
  const bool half = args.shape.dtype == DType::Float16;
  const int head_dim = args.shape.head_dim;
  const Launch launch =
      head_dim == 64    ? (half ? flash_sm90::launch_backward_f16_64 : flash_sm90::launch_backward_bf16_64)
      : head_dim == 128 ? (half ? flash_sm90::launch_backward_f16_128 : flash_sm90::launch_backward_bf16_128)
                        : (half ? flash_sm90::launch_backward_f16_256 : flash_sm90::launch_backward_bf16_256);
  launch(args, scratch.row_dot, scratch.dq_accumulator, stream);
  GE2_CHECK_LAUNCH("attention flash_sm90 backward (dK, dV, dQ accumulation)");
  launch_flash_backward_dq_store(args, scratch, stream);
#else
  (void)args;
  (void)workspace;
  (void)stream;
  throw std::invalid_argument("kernel: flash_sm90 is NOT BUILT: " + flash_sm90_not_built_reason());
#endif
}

}  // namespace ge2::attention
