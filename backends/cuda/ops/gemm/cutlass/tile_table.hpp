// The cutlass_sm90 candidate's tile/schedule choice per dtype, epilogue and problem shape: the rules in
// tile_rules.inc, which benchmarks/sweep_cutlass_gemm.py writes after timing every TileConfig (and the swizzles and
// raster orders of the large problems) on the GPU. One table per dtype for act none (any configuration) and one for
// the activations (the configurations compiled for every activation); the rules key on the count of 128x128 output
// tiles, ceil(M/128) * ceil(N/128).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cutlass_sm90.hpp"

namespace ge2::gemm::cutlass_sm90 {

struct TileRule {
  int64_t max_output_tiles_128;  // the rule applies when ceil(M/128) * ceil(N/128) <= this
  Schedule schedule;
};

// In every table the first rule whose limit the problem's tile count does not exceed wins; the last one matches
// everything.
#include "tile_rules.inc"

struct TileConfigName {
  const char* name;
  TileConfig config;
};
// The names GE2_CUTLASS_SM90_TILE and the sweep use: schedule_<tile M>x<tile N>x<tile K>[_cluster<M>x<N>].
constexpr TileConfigName kTileConfigNames[] = {
    {"pingpong_64x128x64", TileConfig::Pingpong64x128},
    {"cooperative_128x128x64", TileConfig::Cooperative128x128},
    {"pingpong_128x128x64_cluster2x1", TileConfig::Pingpong128x128Cluster2x1},
    {"cooperative_128x256x64_cluster2x1", TileConfig::Cooperative128x256Cluster2x1},
    {"cooperative_128x256x64", TileConfig::Cooperative128x256},
    {"pingpong_128x128x64", TileConfig::Pingpong128x128},
    {"pingpong_128x128x64_cluster2x1_noc", TileConfig::Pingpong128x128Cluster2x1NoC},
};
// The configurations compiled for act none only (see TileConfig).
constexpr TileConfig kActNoneOnly[] = {TileConfig::Cooperative128x256, TileConfig::Pingpong128x128,
                                       TileConfig::Pingpong128x128Cluster2x1NoC};
// Of those, the ones without a C operand (a problem with a residual takes the activations' table instead).
constexpr TileConfig kWithoutC[] = {TileConfig::Pingpong128x128Cluster2x1NoC};

inline TileConfig tile_config_from_name(const std::string& name) {
  std::string names;
  for (const TileConfigName& entry : kTileConfigNames) {
    if (name == entry.name) return entry.config;
    names += names.empty() ? entry.name : std::string(", ") + entry.name;
  }
  throw std::invalid_argument("GE2_CUTLASS_SM90_TILE: expected one of " + names + ", got '" + name + "'");
}

inline int swizzle_from_text(const std::string& text) {
  if (text == "1" || text == "2" || text == "4" || text == "8") return std::stoi(text);
  throw std::invalid_argument("GE2_CUTLASS_SM90_SWIZZLE: expected 1, 2, 4 or 8, got '" + text + "'");
}

inline Raster raster_from_text(const std::string& text) {
  if (text == "heuristic") return Raster::Heuristic;
  if (text == "m") return Raster::AlongM;
  if (text == "n") return Raster::AlongN;
  throw std::invalid_argument("GE2_CUTLASS_SM90_RASTER: expected heuristic, m or n, got '" + text + "'");
}

template <size_t kRules>
Schedule first_matching_rule(const TileRule (&table)[kRules], int64_t tiles) {
  for (const TileRule& rule : table) {
    if (tiles <= rule.max_output_tiles_128) return rule.schedule;
  }
  throw std::logic_error("cutlass_sm90: a tile table's last rule must match every problem");
}

// has_residual: the problem reads C (beta != 0); the act-none table's configurations without C then give way to the
// activations' table, measured with a residual.
inline Schedule choose_schedule(bool float16, bool act_none, bool has_residual, int64_t m, int64_t n) {
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128);
  if (act_none) {
    const Schedule plain = float16 ? first_matching_rule(kTileTableFloat16ActNone, tiles)
                                   : first_matching_rule(kTileTableBFloat16ActNone, tiles);
    bool without_c = false;
    for (TileConfig config : kWithoutC) without_c = without_c || config == plain.config;
    if (!(has_residual && without_c)) return plain;
  }
  return float16 ? first_matching_rule(kTileTableFloat16Activation, tiles)
                 : first_matching_rule(kTileTableBFloat16Activation, tiles);
}

}  // namespace ge2::gemm::cutlass_sm90
