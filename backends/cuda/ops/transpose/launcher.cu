// transpose launcher: argument checks, the reduction of a transpose to a simplified strided copy, and the named
// kernel's check (tiled_packed, tiled or strided; the Python selector chooses).
// y = x.transpose(perm) is the copy "walk y's axes in order; y is contiguous, x is read through its strides
// permuted". Simplifying that copy drops extent-1 axes and merges the axes that stay neighbours, so a 4-d (0,2,1,3)
// permute is a batched move of whole rows and a 2-d transpose stays 2-d. Then:
//   - the input's unit-stride axis is still innermost: every output row is a contiguous input row, and the strided
//     kernel moves it with 16-byte vectors (or cudaMemcpyAsync when nothing moved at all);
//   - otherwise a tile kernel reads along the input's unit-stride axis and writes along the output's.
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "strided_copy_kernel.hpp"
#include "vector_access.hpp"

namespace ge2::transpose {

Kernel kernel_from_name(const std::string& name) {
  if (name == "tiled_packed") return Kernel::TiledPacked;
  if (name == "tiled") return Kernel::Tiled;
  if (name == "strided") return Kernel::Strided;
  throw std::invalid_argument("kernel: expected one of tiled_packed, tiled, strided, got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::TiledPacked: return "tiled_packed";
    case Kernel::Tiled: return "tiled";
    case Kernel::Strided: return "strided";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  return {
      {"tiled_packed", 30,
       "64x64 shared-memory tiles of 2-byte elements moved as 4-byte words (2x2 transposes in registers): every "
       "warp reads and writes 128 contiguous bytes",
       "2-byte dtype (float16, bfloat16); the input's unit-stride axis moves; both tile axes even and >= 8; x and y "
       "4-byte aligned; every other stride even",
       false, kVectorAlignment, {DType::Float16, DType::BFloat16}},
      {"tiled", 20, "32x32 shared-memory tiles, padded against bank conflicts: coalesced reads and writes",
       "the input's unit-stride axis moves; both tile axes >= 8"},
      {"strided", 10,
       "strided gather in output order: 16-byte vectors when the innermost axis stays innermost, cudaMemcpyAsync "
       "when nothing moves",
       "none (the path that always works)", kFallback, kAnyAlignment},
  };
}

namespace {

constexpr int kMinTileExtent = 8;  // below this most of a tile idles and the strided gather is faster

void check_problem(const Problem& problem) {
  if (problem.rank < 0 || problem.rank > kMaxDims) {
    throw std::invalid_argument("x: expected rank 0 to " + std::to_string(kMaxDims) + ", got " +
                                std::to_string(problem.rank));
  }
  bool seen[kMaxDims] = {};
  int64_t numel = 1;
  for (int j = 0; j < problem.rank; ++j) {
    const int axis = problem.perm[j];
    if (axis < 0 || axis >= problem.rank || seen[axis]) {
      throw std::invalid_argument("perm: expected a permutation of 0.." + std::to_string(problem.rank - 1) +
                                  ", got axis " + std::to_string(axis) + " at position " + std::to_string(j));
    }
    seen[axis] = true;
    if (problem.shape[j] < 0) throw std::invalid_argument("x: extents must be >= 0");
    numel *= problem.shape[j];
  }
  if (numel > 0 && problem.x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (numel > 0 && problem.y == nullptr) throw std::invalid_argument("y: null device pointer");
}

// Walks y's axes in order: y contiguous, x through its permuted strides.
StridedCopy as_copy(const Problem& problem) {
  int64_t dst_strides[kMaxDims] = {};
  int64_t running = 1;
  for (int j = problem.rank - 1; j >= 0; --j) {
    dst_strides[j] = running;
    running *= problem.shape[problem.perm[j]];
  }
  StridedCopy copy;
  for (int j = 0; j < problem.rank; ++j) {
    copy.append(problem.shape[problem.perm[j]], problem.strides[problem.perm[j]], dst_strides[j]);
  }
  return copy;
}

// Axis of a simplified copy that tiles read along (x's unit-stride axis) when it is not y's innermost axis; -1 if
// there is none.
int tile_axis(const StridedCopy& copy) {
  if (copy.rank < 2 || copy.src_strides[copy.rank - 1] == 1) return -1;
  for (int k = 0; k < copy.rank - 1; ++k) {
    if (copy.src_strides[k] == 1) return k;
  }
  return -1;
}

std::string tiled_reason(const StridedCopy& copy, bool packed, int element_bytes, const void* x, const void* y) {
  if (copy.rank < 2) return "nothing moves (the transpose is a plain copy)";
  if (copy.src_strides[copy.rank - 1] == 1) {
    return "the input's unit-stride axis stays innermost, so output rows are input rows (the strided kernel copies "
           "them with vectors)";
  }
  const int a = tile_axis(copy);
  if (a < 0) return "no input axis has stride 1";
  const int b = copy.rank - 1;
  if (copy.shape[a] < kMinTileExtent || copy.shape[b] < kMinTileExtent) {
    return "the tile axes have extents " + std::to_string(copy.shape[a]) + " and " + std::to_string(copy.shape[b]) +
           "; tiles need both >= " + std::to_string(kMinTileExtent);
  }
  const int tile = packed ? kPackedTile : kTile;
  const int64_t tiles = ((copy.shape[a] + tile - 1) / tile) * ((copy.shape[b] + tile - 1) / tile) *
                        (copy.numel() / (copy.shape[a] * copy.shape[b]));
  if (tiles >= (int64_t{1} << 31)) return "more than 2^31 tiles";
  if (!packed) return "";
  if (element_bytes != 2) return "needs a 2-byte dtype, got " + std::to_string(element_bytes) + "-byte elements";
  if (copy.shape[a] % 2 != 0 || copy.shape[b] % 2 != 0) {
    return "needs even tile axes, got extents " + std::to_string(copy.shape[a]) + " and " +
           std::to_string(copy.shape[b]);
  }
  if (!is_aligned(x, 4) || !is_aligned(y, 4)) return "needs x and y 4-byte aligned";
  for (int k = 0; k < copy.rank; ++k) {
    if ((k != a && copy.src_strides[k] % 2 != 0) || (k != b && copy.dst_strides[k] % 2 != 0)) {
      return "needs every stride but the unit ones even";
    }
  }
  return "";
}

TileParams tile_params(const StridedCopy& copy, int tile) {
  const int a = tile_axis(copy), b = copy.rank - 1;
  TileParams params;
  params.extent_a = copy.shape[a];
  params.extent_b = copy.shape[b];
  params.src_stride_b = copy.src_strides[b];
  params.dst_stride_a = copy.dst_strides[a];
  const int64_t tiles_a = (params.extent_a + tile - 1) / tile, tiles_b = (params.extent_b + tile - 1) / tile;
  params.tiles_a = FastDivmod(tiles_a);
  params.tiles_b = FastDivmod(tiles_b);
  int64_t batch = 1;
  for (int k = 0; k < copy.rank; ++k) {
    if (k == a || k == b) continue;
    params.batch_shape[params.batch_rank] = FastDivmod(copy.shape[k]);
    params.src_batch_strides[params.batch_rank] = copy.src_strides[k];
    params.dst_batch_strides[params.batch_rank] = copy.dst_strides[k];
    ++params.batch_rank;
    batch *= copy.shape[k];
  }
  params.total_tiles = tiles_a * tiles_b * batch;
  return params;
}

std::string reason_for(Kernel kernel, const Problem& problem, const StridedCopy& simple) {
  if (kernel == Kernel::Strided) return "";
  return tiled_reason(simple, kernel == Kernel::TiledPacked, static_cast<int>(dtype_size(problem.dtype)), problem.x,
                      problem.y);
}

}  // namespace

std::string unsupported_reason(Kernel kernel, const Problem& problem) {
  check_problem(problem);
  return reason_for(kernel, problem, simplified(as_copy(problem)));
}

Kernel forward(const Problem& problem, Kernel kernel, cudaStream_t stream) {
  check_problem(problem);
  const StridedCopy copy = as_copy(problem);
  const StridedCopy simple = simplified(copy);
  const std::string reason = reason_for(kernel, problem, simple);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
  if (simple.numel() == 0) return kernel;
  const int element_bytes = static_cast<int>(dtype_size(problem.dtype));
  switch (kernel) {
    case Kernel::TiledPacked:
      launch_tiled_packed(problem.x, problem.y, tile_params(simple, kPackedTile), stream);
      break;
    case Kernel::Tiled:
      launch_tiled(problem.x, problem.y, tile_params(simple, kTile), element_bytes, stream);
      break;
    case Kernel::Strided:
      launch_strided_copy(problem.x, problem.y, copy, element_bytes, stream);
      break;
  }
  return kernel;
}

void copy(const void* src, void* dst, int64_t nbytes, cudaStream_t stream) {
  if (nbytes < 0) throw std::invalid_argument("nbytes: expected >= 0, got " + std::to_string(nbytes));
  if (nbytes == 0) return;
  if (src == nullptr) throw std::invalid_argument("src: null device pointer");
  if (dst == nullptr) throw std::invalid_argument("dst: null device pointer");
  GE2_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(nbytes), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace ge2::transpose
