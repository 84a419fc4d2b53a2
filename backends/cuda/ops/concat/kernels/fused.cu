// The fused concat/split kernel: one launch moves up to 32 parts. The parts' pointers, widths, column offsets and
// block ranges travel by value in the kernel arguments (about 1.6 KB, read through the constant cache), so there is
// no device-side table to upload and the launch can be captured in a CUDA graph as is.
//
// Part i owns the blocks [first_block[i], first_block[i + 1]); each block moves 256 x 4 consecutive units of its
// part (loads of all 4 issued before the first store). A unit's row and column come from one fast division by the
// part's width; the other side's offset is row * row_width + column_i + column. Units are 16 bytes when every
// width, column offset, row width and pointer is a multiple of 16 bytes (8, 4, 2 bytes otherwise, down to the
// element), so large concats move at copy speed.
#include <algorithm>

#include "api.hpp"
#include "fast_divmod.hpp"
#include "status.hpp"
#include "strided_copy.hpp"

namespace ge2::concat {
namespace {

struct FusedParams {
  int count = 0;
  int64_t row_width = 0;  // y's (or dy's) row, in units
  void* data[kMaxPartsPerLaunch] = {};
  FastDivmod width[kMaxPartsPerLaunch];
  int64_t column[kMaxPartsPerLaunch] = {};  // first column of the part in the whole's rows, in units
  int64_t numel[kMaxPartsPerLaunch] = {};   // outer * width
  int64_t first_block[kMaxPartsPerLaunch + 1] = {};
};

// kSplit: whole -> parts (backward); otherwise parts -> whole (forward).
template <typename Unit, typename Index, bool kSplit>
__global__ void __launch_bounds__(kCopyThreads) fused_kernel(Unit* __restrict__ whole,
                                                             const __grid_constant__ FusedParams p) {
  const int64_t block = blockIdx.x;
  int part = 0;
  while (part + 1 < p.count && block >= p.first_block[part + 1]) ++part;
  Unit* __restrict__ data = static_cast<Unit*>(p.data[part]);
  const Index numel = static_cast<Index>(p.numel[part]);
  const Index base = static_cast<Index>(block - p.first_block[part]) * kCopyThreads * kCopyItems + threadIdx.x;
  Unit values[kCopyItems];
  int64_t whole_offsets[kCopyItems];
#pragma unroll
  for (int item = 0; item < kCopyItems; ++item) {
    const Index index = base + item * kCopyThreads;
    if (index < numel) {
      Index column;
      const Index row = p.width[part].divmod(index, column);
      whole_offsets[item] = static_cast<int64_t>(row) * p.row_width + p.column[part] + static_cast<int64_t>(column);
      values[item] = kSplit ? whole[whole_offsets[item]] : data[index];
    }
  }
#pragma unroll
  for (int item = 0; item < kCopyItems; ++item) {
    const Index index = base + item * kCopyThreads;
    if (index < numel) {
      if (kSplit) {
        data[index] = values[item];
      } else {
        whole[whole_offsets[item]] = values[item];
      }
    }
  }
}

// Largest unit (bytes) dividing every width, column offset, the row width and every pointer.
int unit_bytes(const void* whole, const std::vector<void*>& parts, const Layout& layout, int element_bytes) {
  int64_t row = 0;
  for (int64_t width : layout.widths) row += width;
  for (int width = 16; width > element_bytes; width /= 2) {
    bool fits = (row * element_bytes) % width == 0 && reinterpret_cast<std::uintptr_t>(whole) % width == 0;
    int64_t column = 0;
    for (std::size_t i = 0; i < parts.size() && fits; ++i) {
      fits = (layout.widths[i] * element_bytes) % width == 0 && (column * element_bytes) % width == 0 &&
             reinterpret_cast<std::uintptr_t>(parts[i]) % width == 0;
      column += layout.widths[i];
    }
    if (fits) return width;
  }
  return element_bytes;
}

template <typename Unit, bool kSplit>
void launch_typed(void* whole, const FusedParams& params, int64_t blocks, bool narrow, cudaStream_t stream) {
  auto* typed = static_cast<Unit*>(whole);
  if (narrow) {
    fused_kernel<Unit, uint32_t, kSplit><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(typed, params);
  } else {
    fused_kernel<Unit, uint64_t, kSplit><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(typed, params);
  }
}

}  // namespace

void launch_fused(void* whole, const std::vector<void*>& parts, const Layout& layout, bool split, cudaStream_t stream) {
  const int element_bytes = static_cast<int>(dtype_size(layout.dtype));
  const int unit = unit_bytes(whole, parts, layout, element_bytes);
  const int64_t ratio = unit / element_bytes;
  int64_t row_width = 0;
  for (int64_t width : layout.widths) row_width += width;
  constexpr int64_t kUnitsPerBlock = kCopyThreads * kCopyItems;
  int64_t column = 0;  // elements
  std::size_t next = 0;
  while (next < parts.size()) {
    FusedParams params;
    params.row_width = row_width / ratio;
    bool narrow = true;
    for (; next < parts.size() && params.count < kMaxPartsPerLaunch; ++next) {
      const int64_t width = layout.widths[next];
      const int64_t part_column = column;
      column += width;
      if (width == 0 || layout.outer == 0) continue;  // nothing to move
      const int i = params.count++;
      params.data[i] = parts[next];
      params.width[i] = FastDivmod(width / ratio);
      params.column[i] = part_column / ratio;
      params.numel[i] = layout.outer * (width / ratio);
      params.first_block[i + 1] = params.first_block[i] + (params.numel[i] + kUnitsPerBlock - 1) / kUnitsPerBlock;
      narrow = narrow && params.numel[i] < (int64_t{1} << 31);
    }
    const int64_t blocks = params.first_block[params.count];
    if (blocks == 0) continue;
    if (blocks >= (int64_t{1} << 31)) throw std::invalid_argument("concat: more than 2^31 - 1 blocks in one launch");
    GE2_DISPATCH_UNIT(unit, {
      if (split) {
        launch_typed<Unit, true>(whole, params, blocks, narrow, stream);
      } else {
        launch_typed<Unit, false>(whole, params, blocks, narrow, stream);
      }
    });
    GE2_CHECK_LAUNCH("concat fused_kernel");
  }
}

}  // namespace ge2::concat
