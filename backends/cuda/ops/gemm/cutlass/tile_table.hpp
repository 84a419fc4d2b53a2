// The cutlass_sm90 candidate's tile/schedule choice per problem shape, written by benchmarks/sweep_cutlass_gemm.py
// (which times every TileConfig, and the swizzles of the large ones, on the H200 and prints kTileTable: paste it
// below). The rules key on the count of 128x128 output tiles, ceil(M/128) * ceil(N/128).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cutlass_sm90.hpp"

namespace ge2::gemm::cutlass_sm90 {

struct TileRule {
  int64_t max_output_tiles_128;  // the rule applies when ceil(M/128) * ceil(N/128) <= this
  Schedule schedule;
};

// First matching rule wins; the last one matches everything. The sweep of 2 configurations (ping-pong 64x128 below
// 132 tiles, cooperative 128x128 above) set the first rule; the large-tile rule is the unmeasured starting point
// (CUTLASS's profiler and cuBLAS run 128x256 tiles in 2-CTA clusters on large Hopper GEMMs), from 512 tiles on,
// where the 128x256 tiles still make about two full waves of the H200's 132 SMs.
constexpr TileRule kTileTable[] = {
    {131, {TileConfig::Pingpong64x128, 1}},  // fewer 128x128 tiles than the H200's 132 SMs
    {511, {TileConfig::Cooperative128x128, 1}},
    {INT64_MAX, {TileConfig::Cooperative128x256Cluster2x1, 1}},
};

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
};

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

inline Schedule choose_schedule(int64_t m, int64_t n) {
  const int64_t tiles = ((m + 127) / 128) * ((n + 127) / 128);
  for (const TileRule& rule : kTileTable) {
    if (tiles <= rule.max_output_tiles_128) return rule.schedule;
  }
  throw std::logic_error("cutlass_sm90: kTileTable's last rule must match every problem");
}

}  // namespace ge2::gemm::cutlass_sm90
