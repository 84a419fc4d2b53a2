// The cutlass_sm90 candidate's checks and dispatch (compiled for every architecture, no CUTLASS headers): which
// problems it runs, and which (dtype, activation) instantiation in cutlass/gemm_sm90_*.cu (compiled for sm_90a only,
// when CMake found CUTLASS: GE2_WITH_CUTLASS=1) runs them.
#include <cstdlib>
#include <string>

#include "api.hpp"
#include "cutlass_build.hpp"
#include "status.hpp"

#if GE2_WITH_CUTLASS
#include "cutlass/cutlass_sm90.hpp"
#include "cutlass/tile_table.hpp"
#endif

namespace ge2::gemm {

std::string cutlass_sm90_unsupported_reason(const ForwardArgs& args, bool pointers_aligned) {
  const std::string not_built = cutlass_not_built_reason();
  if (!not_built.empty()) return "NOT BUILT: " + not_built;
  if (args.dtype != DType::Float16 && args.dtype != DType::BFloat16) {
    return std::string("dtype: float16 or bfloat16 only, got ") + dtype_name(args.dtype);
  }
  if (args.trans_a || args.trans_b) return "row-major A and B only (trans_a and trans_b false)";
  if (args.act != Act::None && args.act != Act::Relu && args.act != Act::Gelu && args.act != Act::GeluErf &&
      args.act != Act::Silu) {
    return "act: none, relu, gelu, gelu_erf or silu only";
  }
  if (args.preact != nullptr) return "save_preact: the pre-activation is not written";
  if (args.k % 8 != 0 || args.n % 8 != 0) {
    return "K and N must be multiples of 8 (16-byte TMA rows), got K = " + std::to_string(args.k) +
           ", N = " + std::to_string(args.n);
  }
  if (args.m > INT32_MAX || args.n > INT32_MAX || args.k > INT32_MAX) return "M, N, K must be below 2^31";
  if (!pointers_aligned) return "a, b, c, y and bias pointers must be 16-byte aligned (TMA reads 16-byte rows)";
  const int capability = current_compute_capability();
  if (capability != 90) {
    return "needs an sm_90 GPU (built for sm_90a), this device is " +
           (capability < 0 ? std::string("absent") : "sm_" + std::to_string(capability));
  }
  return "";
}

void launch_cutlass_sm90(const ForwardArgs& args, cudaStream_t stream) {
#if GE2_WITH_CUTLASS
  using namespace cutlass_sm90;
  Problem problem;
  problem.a = args.a;
  problem.b = args.b;
  problem.c = args.c;
  problem.bias = args.bias;
  problem.y = args.y;
  problem.m = args.m;
  problem.n = args.n;
  problem.k = args.k;
  problem.alpha = args.alpha;
  problem.beta = args.beta;
  problem.residual_after_act = args.residual_after_act;
  // GE2_CUTLASS_SM90_TILE=<name> forces one configuration, GE2_CUTLASS_SM90_SWIZZLE=<1|2|4|8> the tile scheduler's
  // swizzle (1 when only the configuration is forced), GE2_CUTLASS_SM90_RASTER=<heuristic|m|n> its raster order:
  // benchmarks/sweep_cutlass_gemm.py times each.
  const char* forced_tile = std::getenv("GE2_CUTLASS_SM90_TILE");
  const char* forced_swizzle = std::getenv("GE2_CUTLASS_SM90_SWIZZLE");
  const char* forced_raster = std::getenv("GE2_CUTLASS_SM90_RASTER");
  const bool f16 = args.dtype == DType::Float16;
  const bool has_residual = args.c != nullptr && args.beta != 0.0f;
  Schedule schedule = choose_schedule(f16, args.act == Act::None, has_residual, args.m, args.n);
  if (forced_tile != nullptr && *forced_tile != '\0') schedule = {tile_config_from_name(forced_tile), 1};
  if (forced_swizzle != nullptr && *forced_swizzle != '\0') schedule.max_swizzle = swizzle_from_text(forced_swizzle);
  if (forced_raster != nullptr && *forced_raster != '\0') schedule.raster = raster_from_text(forced_raster);
  switch (args.act) {
    case Act::None:
      return f16 ? launch_f16_none(problem, schedule, stream) : launch_bf16_none(problem, schedule, stream);
    case Act::Relu:
      return f16 ? launch_f16_relu(problem, schedule, stream) : launch_bf16_relu(problem, schedule, stream);
    case Act::Gelu:
      return f16 ? launch_f16_gelu(problem, schedule, stream) : launch_bf16_gelu(problem, schedule, stream);
    case Act::GeluErf:
      return f16 ? launch_f16_gelu_erf(problem, schedule, stream) : launch_bf16_gelu_erf(problem, schedule, stream);
    case Act::Silu:
      return f16 ? launch_f16_silu(problem, schedule, stream) : launch_bf16_silu(problem, schedule, stream);
    default: break;
  }
  throw std::logic_error("cutlass_sm90: activation not instantiated (unsupported_reason should have declined it)");
#else
  (void)args;
  (void)stream;
  throw std::logic_error("cutlass_sm90: " + cutlass_not_built_reason());
#endif
}

}  // namespace ge2::gemm
