// The index type of a launch: 32-bit when every flat offset it computes fits (FastDivmod's multiply-high
// divisions), 64-bit otherwise.
#pragma once
#include <cstdint>

namespace ge2 {

// Calls launch(Index{}) with Index = uint32_t when largest_offset < 2^31, else uint64_t.
template <typename Launch>
void dispatch_offset_index(int64_t largest_offset, Launch&& launch) {
  if (largest_offset < (int64_t{1} << 31)) {
    launch(uint32_t{0});
  } else {
    launch(uint64_t{0});
  }
}

}  // namespace ge2
