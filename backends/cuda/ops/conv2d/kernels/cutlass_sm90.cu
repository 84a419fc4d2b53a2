// The cutlass_sm90 conv2d candidate's checks and dispatch (compiled for every architecture, no CUTLASS headers):
// which problems it runs, and which pass and dtype's instantiation in cutlass/conv_sm90_*.cu (compiled for sm_90a
// only, when CMake found CUTLASS: GE2_WITH_CUTLASS=1) runs them; the backward's dbias is GE2's reduction of dy.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>

#include "api.hpp"
#include "cutlass/conv_sm90.hpp"
#include "cutlass_build.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::conv2d {

std::string cutlass_sm90_unsupported_reason(const Shape& s, const Epilogue& epilogue, bool backward) {
  const std::string not_built = cutlass_not_built_reason();
  if (!not_built.empty()) return "NOT BUILT: " + not_built;
  if (s.layout != Layout::NHWC) return "NHWC only (NCHW runs on cudnn_graph, cudnn or im2col_gemm)";
  if (s.dtype != DType::Float16 && s.dtype != DType::BFloat16) {
    return std::string("float16 and bfloat16 only, got ") + dtype_name(s.dtype);
  }
  if (s.groups != 1) return "groups == 1 only, got groups=" + std::to_string(s.groups);
  if (s.c % 8 != 0 || s.k % 8 != 0) {
    return "input channels C and output channels K must be multiples of 8 (16-byte TMA rows of x, w and y), got C=" +
           std::to_string(s.c) + ", K=" + std::to_string(s.k);
  }
  if (cutlass_sm90::activation_family(epilogue.act) < 0) {
    return std::string("act none, relu, leaky_relu, gelu or silu only (the instantiated ones), got ") +
           act_name(epilogue.act);
  }
  if (backward && epilogue.act != Act::None) {
    return "backward with act none only (dy is the convolution's gradient: no activation to recompute)";
  }
  if (backward && (s.stride_h != 1 || s.stride_w != 1)) {
    return "backward with stride 1 only (CUTLASS 4.2's sm90 dgrad has no strided form), got stride " +
           std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w);
  }
  // TMA's im2col mode for 2-d filters: the padding and the corners of the window it walks (fprop and wgrad over x,
  // dgrad over dy) within 8-bit signed offsets, the dilated filter extent within 8 bits.
  const int pad_bottom = cutlass_sm90::far_padding(s.p, s.h, s.r, s.stride_h, s.dilation_h, s.pad_top);
  const int pad_right = cutlass_sm90::far_padding(s.q, s.w, s.s, s.stride_w, s.dilation_w, s.pad_left);
  const int64_t extent_h = (s.r - 1) * s.dilation_h, extent_w = (s.s - 1) * s.dilation_w;
  const auto within = [](int64_t corner) { return corner >= -128 && corner <= 127; };
  bool fits = s.pad_top <= 128 && s.pad_left <= 128 && within(pad_bottom - extent_h) &&
              within(pad_right - extent_w) && extent_h < 255 && extent_w < 255;
  if (backward) {  // dgrad's corners: pad - extent and pad - extent + H - P
    fits = fits && within(s.pad_top - extent_h) && within(s.pad_left - extent_w) &&
           within(s.pad_top - extent_h + s.h - s.p) && within(s.pad_left - extent_w + s.w - s.q);
  }
  if (!fits) {
    return "padding up to 128 and a dilated filter extent (R-1)*dilation below 255 (TMA im2col offsets), got "
           "padding top/left " + std::to_string(s.pad_top) + "/" + std::to_string(s.pad_left) + ", filter " +
           std::to_string(s.r) + "x" + std::to_string(s.s) + " dilation " + std::to_string(s.dilation_h) + "x" +
           std::to_string(s.dilation_w);
  }
  if (s.stride_h > 8 || s.stride_w > 8) {
    return "stride up to 8 (TMA im2col element strides), got " + std::to_string(s.stride_h) + "x" +
           std::to_string(s.stride_w);
  }
  if (s.n * s.h * s.w * s.c > INT32_MAX || s.n * s.p * s.q * s.k > INT32_MAX || s.k * s.r * s.s * s.c > INT32_MAX) {
    return "x, w and y must each have fewer than 2^31 elements (CUTLASS's 32-bit conv extents)";
  }
  const int capability = current_compute_capability();
  if (capability != 90) {
    return "needs an sm_90 GPU (built for sm_90a), this device is " +
           (capability < 0 ? std::string("absent") : "sm_" + std::to_string(capability));
  }
  return "";
}

namespace {

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

using cutlass_sm90::PointwiseTile;

// GE2_CUTLASS_SM90_CONV_1X1's names of the 1x1 GEMM's tiles. The _noc ones (float16 only) are their namesakes
// without the epilogue's source operand: more mainloop stages where the residual's shared memory made room for one
// (gemm_64x128 8 -> 9, coop_256x64 4 -> 5, trans_128x192 4 -> 5, coop_256x128 4 and 4) and each TMA store of y delayed
// by one epilogue subtile; a problem with a residual runs on the namesake.
constexpr std::pair<const char*, PointwiseTile> kPointwiseTiles[] = {
    {"gemm_128x64", PointwiseTile::Pingpong128x64},
    {"gemm_64x128", PointwiseTile::Pingpong64x128},
    {"coop_256x64", PointwiseTile::Cooperative256x64},
    {"coop_256x128", PointwiseTile::Cooperative256x128},
    {"trans_128x192", PointwiseTile::Transposed128x192},
    {"gemm_64x128_noc", PointwiseTile::Pingpong64x128NoC},
    {"coop_256x64_noc", PointwiseTile::Cooperative256x64NoC},
    {"coop_256x128_noc", PointwiseTile::Cooperative256x128NoC},
    {"trans_128x192_noc", PointwiseTile::Transposed128x192NoC}};

// The tiles instantiated for float16 only.
bool float16_only(PointwiseTile tile) {
  return tile != PointwiseTile::Pingpong128x64 && tile != PointwiseTile::Pingpong64x128 &&
         tile != PointwiseTile::Cooperative256x64 && tile != PointwiseTile::Cooperative256x128;
}

// The 1x1 GEMM's tile for pointwise problem `s` (with a residual or not) on a GPU of `sms` SMs. H200 figures below:
// N = 32, forward alone in CUDA-graph replay, cuDNN's time / GE2's (higher is better) or us.
//
// float16 without a residual: the rule's tile without C (its _noc twin). Session 40's mid call (ResNet-50's 12
// stride-1 1x1 layers, no bias, each of the four tiles with C against its twin, interleaved) found the twin faster in
// 47 of the 48 pairs, by up to 26% (e.g. C64 H56 K64 coop_256x64 9.7 -> 8.6 us, cuDNN 6.3; C256 H14 K1024
// trans_128x192 11.7 -> 10.3, cuDNN 8.8; C128 H28 K512 coop_256x128 16.8 -> 14.8, cuDNN 16.7); the one loss,
// gemm_64x128 at C1024 H14 K512 (13.7 -> 13.9), is not the rule's tile there. Without C the transposed tile also takes
// reductions past 256 channels over more than one wave: C512 H28 K256 (262 tiles, two waves) 14.8 us on
// trans_128x192_noc against 16.5 on gemm_64x128_noc (cuDNN 12.5), where with C it lost (below). bfloat16 has no twins
// (not measured).
//
// float16, 128 filters or more, C >= 256, and 128 x 192 transposed tiles (ceil(K/128) * ceil(N*H*W/192)) that fill
// their waves of `sms` tiles to 90% or more: the transposed GEMM (filters x pixels), except for reductions past 256
// channels over more than one wave. Why (a reading of the figures, not a proof): its tiles are large (both consumer
// warpgroups on 64 x 192 each), so it wins only where no wave runs part-empty, and only where the reduction (C/64 steps
// of 64 channels) is long enough to amortize its cooperative epilogue (not overlapped with a mainloop, as the ping-pong
// kernel's is); cuBLAS runs this tile shape for PyTorch. Session 38's bench call, against main's tile: won at C512 H28
// K128 0.924 against 0.894 (131 tiles, one wave), C256 H14 K1024 0.740 against 0.647 (264 tiles, two waves), C256 H56
// K128 1.011 against 0.974 (523 tiles, 99% of four waves), C1024 H14 K512 0.873 against 0.828 (132 tiles); lost on
// part-empty waves, C1024 H14 K256 0.704 against 0.929 (66 tiles), C512 H7 K2048 0.554 against 0.738 (144), C2048 H7
// K512 0.406 against 0.842 (36), and on short reductions, C64 H56 K256 0.795 against 0.856, C128 H28 K512 0.725 against
// 0.750; C512 H28 K256 (262 tiles, two waves of a 512-channel reduction) 0.760 against 0.777, the one such layer
// measured, stays on main's tile. bfloat16 has no transposed instantiation (not measured).
//
// Else reductions of at most four 64-channel steps (C <= 256) with a full wave of 256-row tiles: the cooperative
// 256 x 64 (64 filters or fewer) or 256 x 128 tile, both consumer warpgroups on a tile; else the ping-pong 128 x 64 (64
// filters or fewer: a 128-wide tile would compute half empty) or 64 x 128. Why: with so few reduction steps each
// tile's fixed costs (its epilogue's turn, the pipeline's refill) dominate, and the 256-row tile has half as many tiles
// and reads w's slice once per 256 rows. Session 37's mid call, us against the ping-pong tile (cuDNN): C256 H56 K64
// 18.5 against 19.1 (18.1), C64 H56 K256 28.2 against 41.3 (23.3), C128 H28 K512 16.8 against 22.6 (17.5), C64 H56
// K64 9.7 against 11.1 (6.4); ties at C256 H56 K128 (25.0, 25.0) and C256 H14 K1024 (13.4 against 13.3; 200 tiles).
// Longer reductions lost on it: C512 H28 K128 10.4 against 9.3 (98 tiles), C512 H28 K256 18.6 against 15.7, C1024 H14
// K256 14.1 against 8.4; under one wave its tiles leave SMs idle.
PointwiseTile default_pointwise_tile(const Shape& s, int64_t sms, bool residual) {
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const bool float16 = s.dtype == DType::Float16;
  const bool no_c = float16 && !residual;
  const auto chosen = [no_c](PointwiseTile tile) { return no_c ? cutlass_sm90::twin(tile, true) : tile; };
  const int64_t pixels = s.n * s.h * s.w;
  const int64_t transposed_tiles = ceil_div(s.k, 128) * ceil_div(pixels, 192);
  const int64_t waves = ceil_div(transposed_tiles, sms);
  const bool full_waves = transposed_tiles * 10 >= waves * sms * 9;
  if (float16 && s.k >= 128 && s.c >= 256 && full_waves && (s.c <= 256 || waves == 1 || no_c)) {
    return chosen(PointwiseTile::Transposed128x192);
  }
  const bool narrow = s.k <= 64;
  const int64_t wide_tiles = ceil_div(pixels, 256) * (narrow ? 1 : ceil_div(s.k, 128));
  if (s.c <= 256 && wide_tiles >= sms) {
    return chosen(narrow ? PointwiseTile::Cooperative256x64 : PointwiseTile::Cooperative256x128);
  }
  return chosen(narrow ? PointwiseTile::Pingpong128x64 : PointwiseTile::Pingpong64x128);
}

// The tile for pointwise problem `s` (default_pointwise_tile), or none (false) for the conv collective.
// GE2_CUTLASS_SM90_CONV_1X1=conv or a name of kPointwiseTiles forces one (read per launch: the tests check each, a
// benchmark times each in one process; problems that are not pointwise ignore it; the float16-only tiles refuse
// bfloat16).
bool pointwise_tile(const Shape& s, int64_t sms, bool residual, PointwiseTile& tile) {
  const char* forced = std::getenv("GE2_CUTLASS_SM90_CONV_1X1");
  const std::string name(forced == nullptr ? "" : forced);
  if (name.empty()) {
    tile = default_pointwise_tile(s, sms, residual);
    return true;
  }
  if (name == "conv") return false;
  for (const auto& [tile_name, named_tile] : kPointwiseTiles) {
    if (name != tile_name) continue;
    if (float16_only(named_tile) && s.dtype != DType::Float16) {
      throw std::invalid_argument("GE2_CUTLASS_SM90_CONV_1X1: " + name + " runs float16 only, got " +
                                  dtype_name(s.dtype));
    }
    tile = named_tile;
    return true;
  }
  std::string names = "conv";
  for (std::size_t i = 0; i < std::size(kPointwiseTiles); ++i) {
    names += (i + 1 < std::size(kPointwiseTiles) ? ", " : " or ") + std::string(kPointwiseTiles[i].first);
  }
  throw std::invalid_argument("GE2_CUTLASS_SM90_CONV_1X1: expected " + names + ", got '" + name + "'");
}

#if GE2_WITH_CUTLASS
int sm_count() {
  int device = 0, sms = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));  // cheap: no cache needed
  return sms;
}

// The tile of the forward and of dgrad: 128 output pixels by 64 columns (the forward's filters K, dgrad's channels
// C) where `narrow_by_default`, else by 128; GE2_CUTLASS_SM90_CONV_TILE=128x128|128x64 forces one for every launch
// (read per launch, so the tests check both tiles and a benchmark times both in one process).
bool narrow_tile(bool narrow_by_default) {
  const char* forced = std::getenv("GE2_CUTLASS_SM90_CONV_TILE");
  if (forced == nullptr || *forced == '\0') return narrow_by_default;
  const std::string name(forced);
  if (name == "128x64") return true;
  if (name == "128x128") return false;
  throw std::invalid_argument("GE2_CUTLASS_SM90_CONV_TILE: expected 128x128 or 128x64, got '" + name + "'");
}

// Whether the forward runs on the persistent ping-pong kernel (64 x 128 tiles, conv_sm90_pingpong.cuh) rather than the
// conv collective's one CTA per tile: for more than 64 filters (a 128-wide tile is full) with a piecewise-linear
// activation (the smooth family's epilogue is not instantiated there). H200, session 36's mid call, N = 32 float16,
// forward alone in CUDA-graph replay against cuDNN: C128 H28 K128 3x3 15.4 us, 1.157x (the collective's 128 x 128
// tiles 20.9 us, 0.853x: 196 CTAs on 132 SMs, a part-empty second wave; 1.066x without the programmatic launch);
// C256 H14 K256 3x3 16.3 us, 1.074x (128 x 128: 16.0 us, 1.072x). C64 H56 K64 3x3 took 60-66 us (half-empty tiles),
// against 25.3 on the collective's 128 x 64. GE2_CUTLASS_SM90_CONV_FPROP=conv|pingpong forces one (read per launch;
// pingpong refuses the smooth family).
bool pingpong_forward(const ForwardArgs& args) {
  const char* forced = std::getenv("GE2_CUTLASS_SM90_CONV_FPROP");
  const std::string name(forced == nullptr ? "" : forced);
  const bool linear = cutlass_sm90::activation_family(args.act) == 0;
  if (name.empty()) return linear && args.shape.k > 64;
  if (name == "conv") return false;
  if (name != "pingpong") {
    throw std::invalid_argument("GE2_CUTLASS_SM90_CONV_FPROP: expected conv or pingpong, got '" + name + "'");
  }
  if (!linear) {
    throw std::invalid_argument(std::string("GE2_CUTLASS_SM90_CONV_FPROP: pingpong runs act none, relu or leaky_relu "
                                            "only, got ") + act_name(args.act));
  }
  return true;
}

using cutlass_sm90::kWgradTileChannels;
using cutlass_sm90::kWgradTileFilters;
using cutlass_sm90::kWgradTilePixels;
using cutlass_sm90::WgradSlices;

// The slices for problem `s` on a GPU of `sms` SMs: the count the cost model below finds cheapest, or `forced` (> 0)
// slices, cut down so that every slice has a k tile. The wgrad kernel runs one CTA per SM (its pipeline fills the
// shared memory) and one CTA per output tile and slice, so a layer of few output tiles (K*R*S*C small against the
// reduction: 9 tiles for C = K = 64 3x3, against 1,568 k tiles at N = 32, 56 x 56) leaves most SMs idle without
// slices. Measured on the H200 (N = 32 ResNet-50 layers, wgrad alone, CUDA-graph replay): the CTAs of one wave
// share L2 bandwidth, so past ~100 of them a slice's k tiles get slower and a second wave costs more than it saves
// (C128 H28 K128 3x3, 18 tiles: 7 slices 18.4 us, 8 slices 27.0; C256 H14 K256 3x3, 72 tiles: 1 slice 21.4 us, 2
// slices 28.7), while filling the wave paid everywhere (C64 H56 K64 3x3: 1 slice 245 us, 14 slices 42.0). So: the
// counts that keep one wave, costed as k tiles per slice plus the adding kernel (a launch, and reading every slice's
// partial sums), in the time of one k tile.
WgradSlices wgrad_slices(const Shape& s, int sms, int forced) {
  constexpr int64_t kSumLaunchCost = 16;             // the adding kernel's launch and tail, in k tiles
  constexpr int64_t kSumBytesPerKTile = 512 * 1024;  // float32 partial sums it reads per k tile's time
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t tiles = ceil_div(s.k, kWgradTileFilters) * ceil_div(s.c, kWgradTileChannels) * s.r * s.s;
  const int64_t k_tiles = ceil_div(s.n * s.p * s.q, kWgradTilePixels);
  const int64_t dw_bytes = s.k * s.r * s.s * s.c * static_cast<int64_t>(sizeof(float));
  const auto plan = [&](int64_t wanted) {
    WgradSlices slices;
    slices.k_tiles_per_slice = ceil_div(k_tiles, std::max<int64_t>(1, std::min(wanted, k_tiles)));
    slices.count = static_cast<int>(ceil_div(k_tiles, slices.k_tiles_per_slice));  // no empty slice
    slices.workspace_bytes = slices.count > 1 ? static_cast<std::size_t>(slices.count * dw_bytes) : 0;
    return slices;
  };
  if (forced > 0) return plan(forced);
  WgradSlices best = plan(1);
  int64_t best_cost = best.k_tiles_per_slice;
  for (int64_t wanted = 2; wanted <= std::min<int64_t>(k_tiles, sms / tiles); ++wanted) {
    const WgradSlices slices = plan(wanted);
    const int64_t cost = slices.k_tiles_per_slice + kSumLaunchCost +
                         static_cast<int64_t>(slices.workspace_bytes) / kSumBytesPerKTile;
    if (cost < best_cost) best = slices, best_cost = cost;
  }
  return best;
}

// dgrad's tile: 128 x 64 (4 stages, two CTAs per SM) for 64 channels or fewer, where the 128-wide tile computes half
// empty, and for reductions (K*R*S) of two 64-filter steps or fewer, whose short CTAs gain from a second CTA per SM
// hiding one's prologue and epilogue; else 128 x 128. H200, dgrad alone at N = 32: C64 H56 K64 3x3 23.1 us against
// 41.9, C256 H56 K64 1x1 31.2 against 37.4, C512 H28 K128 1x1 17.6 against 20.4; C128 H28 K128 3x3 22.7 against
// 17.4 and C256 H14 K256 3x3 18.9 against 14.4 (long reductions) stay on 128 x 128.
bool dgrad_narrow_by_default(const Shape& s) { return s.c <= 64 || s.k * s.r * s.s <= 128; }

// GE2_CUTLASS_SM90_WGRAD_SLICES=<n> forces wgrad's reduction into n slices (fewer where it has fewer k tiles), 1 for
// none; unset, the cost model of wgrad_slices chooses. Read per launch, so the tests run every path.
int forced_wgrad_slices() {
  const char* forced = std::getenv("GE2_CUTLASS_SM90_WGRAD_SLICES");
  if (forced == nullptr || *forced == '\0') return 0;
  char* end = nullptr;
  const long slices = std::strtol(forced, &end, 10);
  if (*end != '\0' || slices < 1 || slices > 1024) {
    throw std::invalid_argument(std::string("GE2_CUTLASS_SM90_WGRAD_SLICES: expected a slice count 1..1024, got '") +
                                forced + "'");
  }
  return static_cast<int>(slices);
}

void wgrad(const BackwardArgs& args, cudaStream_t stream) {
  using namespace cutlass_sm90;
  const bool f16 = args.shape.dtype == DType::Float16;
  const WgradSlices slices = wgrad_slices(args.shape, sm_count(), forced_wgrad_slices());
  if (slices.count == 1) return (f16 ? wgrad_f16 : wgrad_bf16)(args, stream);
  float* workspace = static_cast<float*>(StreamWorkspace::get(slices.workspace_bytes, stream));
  (f16 ? wgrad_sliced_f16 : wgrad_sliced_bf16)(args, slices, workspace, stream);
}
#endif

}  // namespace

std::string cutlass_sm90_pointwise_tile(const Shape& s, Act act, int64_t sms, bool residual) {
  PointwiseTile tile{};
  if (!cutlass_sm90::pointwise(s, act) || !pointwise_tile(s, sms, residual, tile)) return "conv";
  for (const auto& [tile_name, named_tile] : kPointwiseTiles) {
    if (named_tile == tile) return tile_name;
  }
  throw std::logic_error("cutlass_sm90: a 1x1 GEMM tile without a name");
}

bool cutlass_sm90_aligned(const ForwardArgs& args) {
  return aligned_16(args.x) && aligned_16(args.w) && aligned_16(args.y) && aligned_16(args.bias) &&
         aligned_16(args.residual);
}

void cutlass_sm90_forward(const ForwardArgs& args, cudaStream_t stream) {
#if GE2_WITH_CUTLASS
  using namespace cutlass_sm90;
  using Fprop = void (*)(const ForwardArgs&, cudaStream_t);
  static constexpr Fprop kFprop[2][2][2] = {  // [narrow tile][bfloat16][activation family]
      {{fprop_128x128_f16_linear, fprop_128x128_f16_smooth}, {fprop_128x128_bf16_linear, fprop_128x128_bf16_smooth}},
      {{fprop_128x64_f16_linear, fprop_128x64_f16_smooth}, {fprop_128x64_bf16_linear, fprop_128x64_bf16_smooth}}};
  const bool bf16 = args.shape.dtype == DType::BFloat16;
  PointwiseTile tile{};
  if (pointwise(args.shape, args.act) && pointwise_tile(args.shape, sm_count(), args.residual != nullptr, tile)) {
    return (bf16 ? fprop_1x1_bf16 : fprop_1x1_f16)(args, tile, stream);
  }
  if (pingpong_forward(args)) {
    return (bf16 ? fprop_pingpong_64x128_bf16_linear : fprop_pingpong_64x128_f16_linear)(args, stream);
  }
  const bool narrow = narrow_tile(args.shape.k <= 64);  // 64 filters or fewer: a 128-wide tile computes half empty
  kFprop[narrow][bf16][activation_family(args.act)](args, stream);
#else
  (void)args;
  (void)stream;
  throw std::logic_error("cutlass_sm90: " + cutlass_not_built_reason());
#endif
}

void cutlass_sm90_backward(const BackwardArgs& args, cudaStream_t stream) {
  if (!aligned_16(args.dy) || !aligned_16(args.x) || !aligned_16(args.w) || !aligned_16(args.dx) ||
      !aligned_16(args.dw)) {
    throw std::invalid_argument("dy, x, w, dx, dw: kernel 'cutlass_sm90' needs 16-byte aligned tensors (TMA reads "
                                "and writes 16-byte rows); got an offset view");
  }
#if GE2_WITH_CUTLASS
  const bool f16 = args.shape.dtype == DType::Float16;
  if (args.dbias != nullptr) launch_bias_grad(args.shape, args.dy, args.dbias, /*gemm_layout=*/false, stream);
  if (args.dx != nullptr) {
    using Dgrad = void (*)(const BackwardArgs&, cudaStream_t);
    static constexpr Dgrad kDgrad[2][2] = {  // [narrow tile][bfloat16]
        {cutlass_sm90::dgrad_128x128_f16, cutlass_sm90::dgrad_128x128_bf16},
        {cutlass_sm90::dgrad_128x64_f16, cutlass_sm90::dgrad_128x64_bf16}};
    kDgrad[narrow_tile(dgrad_narrow_by_default(args.shape))][!f16](args, stream);
  }
  if (args.dw != nullptr) wgrad(args, stream);
#else
  (void)stream;
  throw std::logic_error("cutlass_sm90: " + cutlass_not_built_reason());
#endif
}

}  // namespace ge2::conv2d
