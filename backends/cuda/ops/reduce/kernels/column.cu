// Kernel 3, column: reduction over leading or middle axes, the layout [outer, length, inner] with inner > 1:
// y[o, i] = combine over r of x[o, r, i]. A block owns a tile of `width` adjacent vectors of the inner dimension
// (threadIdx.x; each row segment is a contiguous run of at least 64 bytes where the tile allows it) for one outer
// index, and spreads the reduced axis over `lanes` threads (threadIdx.y), four loads in flight each. A shared-memory
// tree combines the lanes of each column in a fixed order. The tile narrows until there are about two tiles per
// SM; when even the narrowest tiles are fewer than the SMs (a short inner dimension reduced over many rows), the
// reduced axis is split into chunks whose float32 partials finalize_partials combines.
// column_wave launches the same kernel sized to the GPU instead: tiles as wide as the inner dimension allows (up to
// 32 vectors, so a row segment is up to 512 contiguous bytes), and the reduced axis split until the blocks fill one
// wave of resident blocks (occupancy x SMs) and no more, each thread's batch of kUnroll loads issued together with
// the tail predicated. EfficientNet-B0's squeeze-and-excitation means (x [32, H*W, C] float16) ran on column at 15%
// of the memory roofline (0.251 of 2.164 ms, H200, session 33): short runs per thread loaded one at a time, and
// split grids just over one wave (288 blocks of 512 threads where 264 are resident).
#include "float_access.hpp"
#include "reduce_common.cuh"
#include "status.hpp"

namespace ge2::reduce {
namespace {

constexpr int kThreads = 512;
constexpr int kWaveThreads = 256;  // column_wave's blocks: finer than kThreads, so one wave fills the SMs evenly
constexpr int kUnroll = 4;

template <typename T, typename Op, int kPack, bool kPredicatedTail>
__global__ void __launch_bounds__(kThreads)
    column_reduce(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ partials, int64_t outer,
                  int64_t length, int64_t inner, int64_t chunk, int64_t splits, float scale) {
  __shared__ float shared[kThreads * kPack];  // [lane][slot][width]: consecutive threadIdx.x, consecutive banks
  const Op op;
  const int width = blockDim.x, lanes = blockDim.y;
  const int64_t inner_packs = inner / kPack;
  const int64_t column_tiles = (inner_packs + width - 1) / width;
  const int64_t outputs = outer * inner;
  for (int64_t task = blockIdx.x; task < outer * column_tiles * splits; task += gridDim.x) {
    const int64_t split = task % splits, tile = task / splits;
    const int64_t o = tile / column_tiles;
    const int64_t pack_column = (tile % column_tiles) * width + threadIdx.x;
    const bool valid = pack_column < inner_packs;
    const int64_t begin = split * chunk, end = min(length, begin + chunk);
    float acc[kPack];
#pragma unroll
    for (int i = 0; i < kPack; ++i) acc[i] = Op::identity();
    if (valid) {
      const T* column = x + o * length * inner + pack_column * kPack;
      int64_t r = begin + threadIdx.y;
      for (; r + (kUnroll - 1) * lanes < end; r += kUnroll * lanes) {
        float values[kUnroll][kPack];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) load_floats<kPack>(column + (r + u * lanes) * inner, values[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int i = 0; i < kPack; ++i) acc[i] = op(acc[i], values[u][i]);
        }
      }
      if (kPredicatedTail && r < end) {  // the last batch: its loads in flight together
        float values[kUnroll][kPack];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (r + u * lanes < end) {
            load_floats<kPack>(column + (r + u * lanes) * inner, values[u]);
          } else {
#pragma unroll
            for (int i = 0; i < kPack; ++i) values[u][i] = Op::identity();
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int i = 0; i < kPack; ++i) acc[i] = op(acc[i], values[u][i]);
        }
      }
      for (; !kPredicatedTail && r < end; r += lanes) {
        float values[kPack];
        load_floats<kPack>(column + r * inner, values);
#pragma unroll
        for (int i = 0; i < kPack; ++i) acc[i] = op(acc[i], values[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kPack; ++i) shared[(threadIdx.y * kPack + i) * width + threadIdx.x] = acc[i];
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.y) < half) {
#pragma unroll
        for (int i = 0; i < kPack; ++i) {
          float& mine = shared[(threadIdx.y * kPack + i) * width + threadIdx.x];
          mine = op(mine, shared[((threadIdx.y + half) * kPack + i) * width + threadIdx.x]);
        }
      }
      __syncthreads();
    }
    if (threadIdx.y == 0 && valid) {
      const int64_t out = o * inner + pack_column * kPack;
      float values[kPack];
#pragma unroll
      for (int i = 0; i < kPack; ++i) values[i] = shared[i * width + threadIdx.x];
      if (partials != nullptr) {
#pragma unroll
        for (int i = 0; i < kPack; ++i) partials[split * outputs + out + i] = values[i];
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) values[i] *= scale;
        store_floats<kPack>(y + out, values);
      }
    }
    __syncthreads();  // the next task overwrites shared
  }
}

// column's plan (kWave false: tiles narrowed to about two per SM, splits only when they are fewer than the SMs) or
// column_wave's (one wave of resident blocks), then the launch and, for a split, the partials' second pass.
template <bool kWave, typename T, typename Op, int kPack>
void launch_planned(const ForwardArgs& args, float scale, cudaStream_t stream) {
  const Layout& layout = args.layout;
  const auto kernel = column_reduce<T, Op, kPack, kWave>;
  const int64_t inner_packs = layout.inner / kPack;
  const auto tiles = [&](int w) { return layout.outer * ((inner_packs + w - 1) / w); };
  int width = std::min(32, next_power_of_two(inner_packs)), lanes = 0;
  Split split;
  if constexpr (kWave) {
    // lanes: enough for each to have a full batch of kUnroll rows where the run allows it
    lanes = std::min(kWaveThreads / width, next_power_of_two((layout.length + kUnroll - 1) / kUnroll));
    int resident = 0;  // blocks of this shape one SM holds at once
    GE2_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, width * lanes, 0));
    const int64_t wave = std::max(1, resident) * int64_t{sm_count()};
    // at most one wave: the split count rounds down (wave / tiles splits); a chunk is at least one batch a lane
    split = plan_split_to(tiles(width), wave / tiles(width) * tiles(width), layout.outputs, layout.length,
                          int64_t{lanes} * kUnroll, lanes, stream);
  } else {
    // Narrow the tile (down to 64-byte row segments) until there are about two tiles per SM.
    const int sms = sm_count();
    const int min_width = std::max<int>(1, 64 / static_cast<int>(kPack * sizeof(T)));
    while (width > min_width && tiles(width) < 2 * int64_t{sms}) width /= 2;
    lanes = std::min(kThreads / width, next_power_of_two(layout.length));
    split = plan_split(tiles(width), layout.outputs, layout.length, int64_t{lanes} * 8, 1, stream);
  }
  kernel<<<grid_blocks(tiles(width) * split.splits, 1), dim3(width, lanes), 0, stream>>>(
      static_cast<const T*>(args.x), static_cast<T*>(args.y), split.partials, layout.outer, layout.length,
      layout.inner, split.chunk, split.splits, scale);
  check_cuda(cudaGetLastError(), GE2_OP_NAME, kWave ? "launch of reduce column_wave" : "launch of reduce column");
  if (split.splits > 1) {
    launch_finalize_partials(split.partials, args.y, layout.outputs, split.splits, args.dtype, args.reduction, scale,
                             stream);
  }
}

template <bool kWave>
void launch_columns(const ForwardArgs& args, cudaStream_t stream) {
  const float scale = output_scale(args.reduction, args.layout.count);
  const bool aligned = is_aligned(args.x, 16) && is_aligned(args.y, 16);
  dispatch_storage(args.dtype, args.layout.inner, aligned, [&](auto type, auto pack) {
    dispatch_reduction(args.reduction, [&](auto op) {
      launch_planned<kWave, typename decltype(type)::type, decltype(op), decltype(pack)::value>(args, scale, stream);
    });
  });
}

}  // namespace

void launch_column(const ForwardArgs& args, cudaStream_t stream) { launch_columns<false>(args, stream); }

void launch_column_wave(const ForwardArgs& args, cudaStream_t stream) { launch_columns<true>(args, stream); }

}  // namespace ge2::reduce
