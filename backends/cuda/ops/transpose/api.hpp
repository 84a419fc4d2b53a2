// transpose: y = x.transpose(perm) into a contiguous y, for any rank <= 8 and any input strides; and the device
// copy that runs reshape when an executor cannot alias it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "fast_divmod.hpp"
#include "tensor_view.hpp"
#include "kernel_info.hpp"

namespace ge2::transpose {

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { TiledPacked, Tiled, Strided };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

struct Problem {
  const void* x = nullptr;
  void* y = nullptr;  // contiguous, shape x.shape[perm[j]]
  DType dtype = DType::Float32;
  int rank = 0;
  int64_t shape[kMaxDims] = {};    // x's shape
  int64_t strides[kMaxDims] = {};  // x's strides, in elements
  int perm[kMaxDims] = {};         // output axis j is input axis perm[j]
};

// Empty when `kernel` can run the problem; otherwise the reason it cannot. Throws std::invalid_argument for a
// problem no kernel can run (bad perm, null pointers, negative extents).
std::string unsupported_reason(Kernel kernel, const Problem& problem);

// Runs `kernel` (std::invalid_argument when it cannot run the problem) and returns it.
Kernel forward(const Problem& problem, Kernel kernel, cudaStream_t stream);

// dst <- src, `nbytes` bytes, device to device.
void copy(const void* src, void* dst, int64_t nbytes, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu and kernels/tiled.cu ----------------------------------------------------

// A transpose whose input's unit-stride axis (a) is not the output's innermost axis (b): tiles of a x b go through
// shared memory so that both the reads (along a) and the writes (along b) are coalesced. The remaining axes are
// batch axes, walked tile by tile.
struct TileParams {
  int64_t extent_a = 0, extent_b = 0;
  int64_t src_stride_b = 0;  // x's stride along b (its stride along a is 1)
  int64_t dst_stride_a = 0;  // y's stride along a (its stride along b is 1)
  FastDivmod tiles_a, tiles_b;
  int batch_rank = 0;
  FastDivmod batch_shape[kMaxDims];
  int64_t src_batch_strides[kMaxDims] = {};
  int64_t dst_batch_strides[kMaxDims] = {};
  int64_t total_tiles = 0;
};

constexpr int kTile = 32;        // tiled: 32 x 32 elements of any size
constexpr int kPackedTile = 64;  // tiled_packed: 64 x 64 two-byte elements, moved as 4-byte words

// `params` has tiles_a, tiles_b and total_tiles computed for the tile size of the variant.
void launch_tiled(const void* x, void* y, const TileParams& params, int element_bytes, cudaStream_t stream);
void launch_tiled_packed(const void* x, void* y, const TileParams& params, cudaStream_t stream);

}  // namespace ge2::transpose
