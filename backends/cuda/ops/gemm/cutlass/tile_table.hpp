// The cutlass_sm90 candidate's tile/schedule choice per problem shape, written by benchmarks/sweep_cutlass_gemm.py
// (which times every TileConfig on the H200 and prints this table). Until the sweep has run on a GPU it holds the
// default rule: the ping-pong 64x128 tile when the cooperative 128x128 tiles would not fill the GPU's SMs once
// (small M*N: each of the two consumer warpgroups then owns a tile), the cooperative 128x128 tile otherwise.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cutlass_sm90.hpp"

namespace ge2::gemm::cutlass_sm90 {

struct TileRule {
  int64_t max_output_tiles_128;  // the rule applies when ceil(M/128) * ceil(N/128) <= this
  TileConfig config;
};

// First matching rule wins; the last one matches everything.
constexpr TileRule kTileTable[] = {
    {131, TileConfig::Pingpong64x128},  // fewer 128x128 tiles than the H200's 132 SMs
    {INT64_MAX, TileConfig::Cooperative128x128},
};

inline TileConfig tile_config_from_name(const std::string& name) {
  if (name == "cooperative_128x128x64") return TileConfig::Cooperative128x128;
  if (name == "pingpong_64x128x64") return TileConfig::Pingpong64x128;
  throw std::invalid_argument("GE2_CUTLASS_SM90_TILE: expected cooperative_128x128x64 or pingpong_64x128x64, got '" +
                              name + "'");
}

inline TileConfig choose_tile(int64_t m, int64_t n) {
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128);
  for (const TileRule& rule : kTileTable) {
    if (tiles <= rule.max_output_tiles_128) return rule.config;
  }
  return TileConfig::Cooperative128x128;
}

}  // namespace ge2::gemm::cutlass_sm90
