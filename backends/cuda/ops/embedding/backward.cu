// embedding backward: dtable[v] = sum of dy[i] over the positions i with ids[i] == v, deterministically.
//   1. sort keys:  key[i] = ids[i] (an out-of-range id becomes `vocab`, sorts last and is skipped), value[i] = i.
//   2. CUB's stable radix sort on the keys (only the bits `vocab` needs): equal ids stay in position order.
//   3. dtable = 0 (rows no id names stay 0).
//   4. tile_sums: fixed tiles of kTile sorted positions; a tile adds its dy rows run by run (float32) and writes a
//      run that starts and ends inside it straight to dtable; the piece of a run that began in an earlier tile goes
//      to head[tile], the piece of one that continues into the next tile to tail[tile].
//   5. combine: the tile in which a crossing run starts adds tail[tile] + head[next tiles...] in tile order and
//      writes the row. Tiles bound the serial work per thread even for an id repeated a million times.
// Every sum runs in a fixed order, so dtable is bitwise reproducible. Workspace (the module's stream workspace):
// 16 bytes per id for keys and values, CUB's scratch, and 2 * ceil(count / kTile) * dim floats of partial sums.
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "api.hpp"
#include "index_checks.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"
#include "vector_access.hpp"

namespace ge2::embedding {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTile = 32;  // sorted positions per tile

template <typename L>
__global__ void __launch_bounds__(kThreads) make_sort_keys(const L* __restrict__ ids, int64_t count, int64_t vocab,
                                                           uint32_t* __restrict__ keys,
                                                           int32_t* __restrict__ positions,
                                                           unsigned long long* id_error) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    const bool in_range = id >= 0 && id < vocab;
    if (!in_range) record_bad_index(id_error, i);
    keys[i] = static_cast<uint32_t>(in_range ? id : vocab);
    positions[i] = static_cast<int32_t>(i);
  }
}

// The columns one lane owns: pack `pack` of a row, kVec elements, accumulated in float32.
template <int kVec>
struct Accumulator {
  float values[kVec];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < kVec; ++i) values[i] = 0.0f;
  }
  template <typename T>
  __device__ __forceinline__ void add(const Pack<T, kVec>& pack) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) values[i] += to_float(pack.values[i]);
  }
  __device__ __forceinline__ void add(const float* partial) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) values[i] += partial[i];
  }
  __device__ __forceinline__ void store(float* partial) const {
#pragma unroll
    for (int i = 0; i < kVec; ++i) partial[i] = values[i];
  }
  template <typename T>
  __device__ __forceinline__ void store(T* row) const {
    Pack<T, kVec> pack;
#pragma unroll
    for (int i = 0; i < kVec; ++i) pack.values[i] = from_float<T>(values[i]);
    store_pack<T, kVec>(row, pack);
  }
};

// The work items of tile_sums and combine: (tile, column slice) pairs, `lanes` lanes each, one pack per lane.
struct TileUnit {
  int64_t tile, pack;
  bool active;  // the lane's pack lies inside the row
};

__device__ __forceinline__ bool unit_of_thread(int lanes, int64_t tiles, int64_t packs_per_row, TileUnit* unit) {
  const int64_t slices = (packs_per_row + lanes - 1) / lanes;
  const int64_t global = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / lanes;
  if (global >= tiles * slices) return false;
  unit->tile = global / slices;
  unit->pack = (global % slices) * lanes + (threadIdx.x & (lanes - 1));
  unit->active = unit->pack < packs_per_row;
  return true;
}

// At most 80 registers (three blocks per SM): a batch's packs and keys in flight without spilling.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, 3) tile_sums(const T* __restrict__ dy, const uint32_t* __restrict__ keys,
                                                      const int32_t* __restrict__ positions, T* __restrict__ dtable,
                                                      float* __restrict__ head, float* __restrict__ tail,
                                                      int64_t count, int64_t vocab, int64_t dim, int lanes) {
  const int64_t packs_per_row = dim / kVec, tiles = (count + kTile - 1) / kTile;
  TileUnit unit;
  if (!unit_of_thread(lanes, tiles, packs_per_row, &unit) || !unit.active) return;
  const int64_t begin = unit.tile * kTile, end = std::min(begin + kTile, count);
  const int64_t column = unit.pack * kVec;
  const uint32_t invalid = static_cast<uint32_t>(vocab);

  Accumulator<kVec> sum;
  sum.clear();
  int64_t piece_begin = begin;
  // Batches of 4 positions: the keys, positions and dy loads of a batch are all issued before any is added.
  constexpr int kBatch = 4;
  for (int64_t base = begin; base < end; base += kBatch) {
    uint32_t batch_keys[kBatch + 1];
    Pack<T, kVec> rows[kBatch];
#pragma unroll
    for (int j = 0; j <= kBatch; ++j) {
      const int64_t at = base + j;
      batch_keys[j] = at < count ? keys[at] : invalid;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (base + j < end && batch_keys[j] != invalid) {
        rows[j] = load_pack<T, kVec>(dy + static_cast<int64_t>(positions[base + j]) * dim + column);
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t at = base + j;
      const uint32_t key = batch_keys[j];
      if (at >= end || key == invalid) break;  // invalid keys sort last: nothing after them
      sum.add(rows[j]);
      const bool run_ends = at + 1 == end || batch_keys[j + 1] != key;
      if (run_ends) {
        const bool began_before = piece_begin == begin && begin > 0 && keys[begin - 1] == key;
        const bool continues = at + 1 == end && end < count && keys[end] == key;
        if (began_before) {
          sum.store(head + unit.tile * dim + column);
        } else if (continues) {
          sum.store(tail + unit.tile * dim + column);
        } else {
          sum.store(dtable + static_cast<int64_t>(key) * dim + column);
        }
        sum.clear();
        piece_begin = at + 1;
      }
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) combine(const uint32_t* __restrict__ keys, T* __restrict__ dtable,
                                                    const float* __restrict__ head, const float* __restrict__ tail,
                                                    int64_t count, int64_t vocab, int64_t dim, int lanes) {
  const int64_t packs_per_row = dim / kVec, tiles = (count + kTile - 1) / kTile;
  TileUnit unit;
  if (!unit_of_thread(lanes, tiles, packs_per_row, &unit) || !unit.active) return;
  const int64_t begin = unit.tile * kTile, end = std::min(begin + kTile, count);
  const uint32_t key = keys[end - 1];
  if (key == static_cast<uint32_t>(vocab)) return;
  if (end == count || keys[end] != key) return;                             // the last run ends in this tile
  if (begin > 0 && keys[begin] == key && keys[begin - 1] == key) return;  // it began earlier: not ours
  const int64_t column = unit.pack * kVec;
  Accumulator<kVec> sum;
  sum.clear();
  sum.add(tail + unit.tile * dim + column);
  for (int64_t tile = unit.tile + 1;; ++tile) {
    sum.add(head + tile * dim + column);
    const int64_t tile_end = std::min((tile + 1) * kTile, count);
    if (tile_end == count || keys[tile_end] != key) break;
  }
  sum.store(dtable + static_cast<int64_t>(key) * dim + column);
}

struct Layout {
  std::size_t keys_in, keys_out, positions_in, positions_out, sort_scratch, head, tail, total;
  std::size_t sort_scratch_bytes;
};

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

Layout plan_workspace(int64_t count, int64_t dim, int end_bit) {
  Layout layout{};
  // CUB's scratch size depends only on the problem size; the call with a null scratch pointer only asks.
  GE2_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, layout.sort_scratch_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(count), 0, end_bit));
  const std::size_t ids_bytes = round_up(sizeof(uint32_t) * static_cast<std::size_t>(count));
  const std::size_t partial_bytes =
      round_up(sizeof(float) * static_cast<std::size_t>((count + kTile - 1) / kTile) * static_cast<std::size_t>(dim));
  std::size_t offset = 256;  // the id-error slot comes first
  layout.keys_in = offset, offset += ids_bytes;
  layout.keys_out = offset, offset += ids_bytes;
  layout.positions_in = offset, offset += ids_bytes;
  layout.positions_out = offset, offset += ids_bytes;
  layout.sort_scratch = offset, offset += round_up(layout.sort_scratch_bytes);
  layout.head = offset, offset += partial_bytes;
  layout.tail = offset, offset += partial_bytes;
  layout.total = offset;
  return layout;
}

int bits_for(int64_t value) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= value) ++bits;
  return bits;
}

template <typename T, int kVec>
void launch_reduction(const BackwardArgs& args, const uint32_t* keys, const int32_t* positions, float* head,
                      float* tail, cudaStream_t stream) {
  const int lanes = lanes_per_row(args.dim / kVec);
  const int64_t tiles = (args.count + kTile - 1) / kTile;
  const int64_t slices = (args.dim / kVec + lanes - 1) / lanes;
  const int64_t units_per_block = kThreads / lanes;
  const int64_t blocks = (tiles * slices + units_per_block - 1) / units_per_block;
  if (blocks > INT32_MAX) throw std::invalid_argument("ids, dim: the problem needs more than 2^31 blocks");
  tile_sums<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(args.dy), keys, positions, static_cast<T*>(args.dtable), head, tail, args.count,
      args.vocab, args.dim, lanes);
  GE2_CHECK_LAUNCH("embedding tile_sums");
  combine<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      keys, static_cast<T*>(args.dtable), head, tail, args.count, args.vocab, args.dim, lanes);
  GE2_CHECK_LAUNCH("embedding combine");
}

void check_backward_args(const BackwardArgs& args) {
  if (args.vocab < 1 || args.vocab >= INT32_MAX) {
    throw std::invalid_argument("vocab: expected 1 <= vocab < 2^31 - 1, got " + std::to_string(args.vocab));
  }
  if (args.dim < 1) throw std::invalid_argument("dim: expected >= 1, got " + std::to_string(args.dim));
  if (args.count < 0 || args.count >= INT32_MAX) {
    throw std::invalid_argument("ids: expected fewer than 2^31 - 1 ids for the backward, got " +
                                std::to_string(args.count));
  }
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  if (args.id_dtype != DType::Int32 && args.id_dtype != DType::Int64) {
    throw std::invalid_argument(std::string("ids: expected dtype int32 or int64, got ") + dtype_name(args.id_dtype));
  }
  if (args.dtable == nullptr) throw std::invalid_argument("dtable: null device pointer");
  if (args.count > 0 && args.dy == nullptr) throw std::invalid_argument("dy: null device pointer");
  if (args.count > 0 && args.ids == nullptr) throw std::invalid_argument("ids: null device pointer");
}

}  // namespace

void backward(const BackwardArgs& args, bool check_ids, cudaStream_t stream) {
  check_backward_args(args);
  const std::size_t table_bytes = static_cast<std::size_t>(args.vocab * args.dim) * dtype_size(args.dtype);
  GE2_CUDA_CHECK(cudaMemsetAsync(args.dtable, 0, table_bytes, stream));
  if (args.count == 0) return;

  const int end_bit = bits_for(args.vocab);  // keys lie in [0, vocab]
  const Layout layout = plan_workspace(args.count, args.dim, end_bit);
  auto* workspace = static_cast<char*>(StreamWorkspace::get(layout.total, stream));
  auto* id_error = reinterpret_cast<unsigned long long*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(workspace + layout.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(workspace + layout.keys_out);
  auto* positions_in = reinterpret_cast<int32_t*>(workspace + layout.positions_in);
  auto* positions_out = reinterpret_cast<int32_t*>(workspace + layout.positions_out);
  auto* head = reinterpret_cast<float*>(workspace + layout.head);
  auto* tail = reinterpret_cast<float*>(workspace + layout.tail);

  if (check_ids) reset_index_error(id_error, stream);
  int device = 0, sms = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int key_blocks = static_cast<int>(std::min<int64_t>((args.count + kThreads - 1) / kThreads, sms * 8));
  GE2_DISPATCH_INDEX(args.id_dtype, "ids",
                     make_sort_keys<index_t><<<key_blocks, kThreads, 0, stream>>>(
                         static_cast<const index_t*>(args.ids), args.count, args.vocab, keys_in, positions_in,
                         id_error));
  GE2_CHECK_LAUNCH("embedding make_sort_keys");
  std::size_t scratch_bytes = layout.sort_scratch_bytes;
  GE2_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(workspace + layout.sort_scratch, scratch_bytes, keys_in, keys_out,
                                                 positions_in, positions_out, static_cast<int>(args.count), 0,
                                                 end_bit, stream));

  const bool vectorized = args.dim % static_cast<int64_t>(16 / dtype_size(args.dtype)) == 0 &&
                          is_aligned(args.dy, 16) && is_aligned(args.dtable, 16);
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    if (vectorized) {
      launch_reduction<scalar_t, kPackSize<scalar_t>>(args, keys_out, positions_out, head, tail, stream);
    } else {
      launch_reduction<scalar_t, 1>(args, keys_out, positions_out, head, tail, stream);
    }
  });

  if (check_ids) throw_if_bad_id(id_error, args.ids, args.id_dtype, args.vocab, stream);
}

}  // namespace ge2::embedding
