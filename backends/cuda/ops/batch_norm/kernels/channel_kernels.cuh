// The two kernel shapes batch_norm's forward and backward share:
//  - channel_partials_*: per-(split, channel) partial reductions of x (forward: Welford count/mean/M2) or of dy and
//    x (backward: sum dy, sum dy * xhat), merged inside a block in a fixed order, written as [3][splits][channels];
//  - channel_affine: the elementwise pass, y = x * k0 + k1 (forward) or dx = dy * k0 + x * k1 + k2 (backward) with
//    per-channel coefficients [3][channels]. It walks the array in the reverse of the partial kernels' order, so
//    that it first meets the data they read last, which may still be in L2.
#pragma once
#include <cstdint>

#include "../api.hpp"
#include "dtype.hpp"
#include "fast_divmod.hpp"
#include "float_access.hpp"

namespace ge2::batch_norm {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 32;  // H100 SMs x resident blocks; grid-stride loops cover the rest

// forward: (count, mean, M2); backward: (sum dy, sum dy * xhat, unused)
struct State {
  float a = 0.0f, b = 0.0f, c = 0.0f;
};

template <bool kBackward>
__device__ __forceinline__ State merge(const State& p, const State& q) {
  if constexpr (kBackward) {
    return {p.a + q.a, p.b + q.b, 0.0f};
  } else {  // Chan et al.'s parallel Welford merge
    // n == 0 only for two empty states ({0, 0, 0}), which the division by 1 then leaves empty. Without a branch
    // here the compiler keeps loads of q unconditional, so a loop of merges can issue them ahead.
    const float n = p.a + q.a;
    const float delta = q.b - p.b, weight = q.a / fmaxf(n, 1.0f);
    return {n, p.b + delta * weight, p.c + q.c + delta * delta * p.a * weight};
  }
}

// Backward: one element's dy and dy * xhat into the sums.
__device__ __forceinline__ void accumulate_gradient(State& s, float x, float dy, float mean, float invstd) {
  s.a += dy;
  s.b += dy * (x - mean) * invstd;
}

// Forward, NCHW: kPack consecutive values of one channel reduced in registers (1 / kPack is exact) and Chan-merged
// into s at once: one division (about ten instructions in IEEE float32) per vector instead of one per element.
template <int kPack>
__device__ __forceinline__ State merge_values(const State& s, const float* values) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPack; ++i) sum += values[i];
  const float mean = sum * (1.0f / kPack);
  float m2 = 0.0f;
#pragma unroll
  for (int i = 0; i < kPack; ++i) m2 += (values[i] - mean) * (values[i] - mean);
  return merge<false>(s, State{static_cast<float>(kPack), mean, m2});
}

// Forward, NHWC: one row's values of kPack channels, Welford updates sharing the reciprocal of the new count (every
// state of a thread has seen the same rows): one division per row instead of one per element.
template <int kPack>
__device__ __forceinline__ void welford_row(State* s, const float* values) {
  const float count = s[0].a + 1.0f, inverse = 1.0f / count;
#pragma unroll
  for (int i = 0; i < kPack; ++i) {
    s[i].a = count;
    const float delta = values[i] - s[i].b;
    s[i].b += delta * inverse;
    s[i].c += delta * (values[i] - s[i].b);
  }
}

// Merges the states of lanes that differ in the bits from kLowestOffset up to 16 of the lane index (xor shuffles:
// every lane gets a total; the lanes' pairing is fixed, so it is deterministic).
template <bool kBackward, int kLowestOffset = 1>
__device__ __forceinline__ State shuffle_merge(State s) {
#pragma unroll
  for (int offset = 16; offset >= kLowestOffset; offset >>= 1) {
    const State other{__shfl_xor_sync(0xffffffffu, s.a, offset), __shfl_xor_sync(0xffffffffu, s.b, offset),
                      __shfl_xor_sync(0xffffffffu, s.c, offset)};
    s = merge<kBackward>(s, other);
  }
  return s;
}

__device__ __forceinline__ void store_partial(float* partials, int64_t splits, int64_t channels, int64_t split,
                                              int64_t channel, const State& s) {
  const int64_t plane = splits * channels, at = split * channels + channel;
  partials[at] = s.a;
  partials[plane + at] = s.b;
  partials[2 * plane + at] = s.c;
}

// NCHW: block = (channel, split) with blockIdx.x = channel * splits + split; the channel's elements are
// [batch][spatial], handled as vectors of kPack along spatial (spatial % kPack == 0).
template <typename T, int kPack, bool kBackward, typename Index>
__global__ void channel_partials_nchw(const T* __restrict__ x, const T* __restrict__ dy,
                                      const float* __restrict__ mean, const float* __restrict__ invstd,
                                      float* __restrict__ partials, int64_t channels, int64_t spatial,
                                      FastDivmod spatial_vectors, int64_t per_channel, int64_t splits) {
  __shared__ State warp_states[kThreads / 32];
  const int64_t channel = blockIdx.x / splits, split = blockIdx.x % splits;
  const int64_t chunk = (per_channel + splits - 1) / splits;
  const Index begin = static_cast<Index>(split * chunk);
  const Index end = static_cast<Index>(min(per_channel, (split + 1) * chunk));
  const float m = kBackward ? mean[channel] : 0.0f, s_inv = kBackward ? invstd[channel] : 0.0f;
  State s;
  for (Index v = begin + threadIdx.x; v < end; v += blockDim.x) {
    Index sv;
    const Index n = spatial_vectors.divmod(v, sv);
    const Index offset = (n * static_cast<Index>(channels) + static_cast<Index>(channel)) * static_cast<Index>(spatial)
                         + sv * kPack;
    float xv[kPack];
    load_floats<kPack>(x + offset, xv);
    if constexpr (kBackward) {
      float gv[kPack];
      load_floats<kPack>(dy + offset, gv);
#pragma unroll
      for (int i = 0; i < kPack; ++i) accumulate_gradient(s, xv[i], gv[i], m, s_inv);
    } else {
      s = merge_values<kPack>(s, xv);
    }
  }
  s = shuffle_merge<kBackward>(s);
  if (threadIdx.x % 32 == 0) warp_states[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    State total = warp_states[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total = merge<kBackward>(total, warp_states[w]);
    store_partial(partials, splits, channels, split, channel, total);
  }
}

// NHWC: x is [rows, channels]; block = (lanes x kThreads / lanes) threads, blockIdx.x = split * tiles + tile; a
// thread handles kPack consecutive channels (channels % kPack == 0) over rows threadIdx.y, + blockDim.y, ...
template <typename T, int kPack, bool kBackward, typename Index>
__global__ void channel_partials_nhwc(const T* __restrict__ x, const T* __restrict__ dy,
                                      const float* __restrict__ mean, const float* __restrict__ invstd,
                                      float* __restrict__ partials, int64_t channels, int64_t rows, int64_t tiles,
                                      int64_t splits) {
  extern __shared__ State row_states[];  // [blockDim.y][blockDim.x * kPack]
  const int64_t tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const int64_t channel = (tile * blockDim.x + threadIdx.x) * kPack;
  const bool active = channel < channels;
  const int64_t chunk = (rows + splits - 1) / splits;
  const Index begin = static_cast<Index>(split * chunk), end = static_cast<Index>(min(rows, (split + 1) * chunk));
  State s[kPack];
  float m[kPack] = {}, s_inv[kPack] = {};
  if (active) {
    if constexpr (kBackward) {
#pragma unroll
      for (int i = 0; i < kPack; ++i) {
        m[i] = mean[channel + i];
        s_inv[i] = invstd[channel + i];
      }
    }
    const auto load_row = [&](Index r, float* xv, float* gv) {
      const Index offset = r * static_cast<Index>(channels) + static_cast<Index>(channel);
      load_floats<kPack>(x + offset, xv);
      if constexpr (kBackward) load_floats<kPack>(dy + offset, gv);
    };
    const auto add_row = [&](const float* xv, const float* gv) {
      if constexpr (kBackward) {
#pragma unroll
        for (int i = 0; i < kPack; ++i) accumulate_gradient(s[i], xv[i], gv[i], m[i], s_inv[i]);
      } else {
        welford_row<kPack>(s, xv);
      }
    };
    // Two rows' loads issued before either is accumulated (still accumulated row by row, in order): the grid is
    // about 4 blocks per SM, and one 16-byte load in flight per thread leaves DRAM latency exposed.
    const Index step = blockDim.y;
    Index r = begin + threadIdx.y;
    for (; r + step < end; r += 2 * step) {
      float x0[kPack], x1[kPack], g0[kPack] = {}, g1[kPack] = {};
      load_row(r, x0, g0);
      load_row(r + step, x1, g1);
      add_row(x0, g0);
      add_row(x1, g1);
    }
    if (r < end) {
      float x0[kPack], g0[kPack] = {};
      load_row(r, x0, g0);
      add_row(x0, g0);
    }
  }
  const int row_width = blockDim.x * kPack;
#pragma unroll
  for (int i = 0; i < kPack; ++i) row_states[threadIdx.y * row_width + threadIdx.x * kPack + i] = s[i];
  __syncthreads();
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int i = 0; i < kPack; ++i) {
      State total = s[i];
      for (int r = 1; r < static_cast<int>(blockDim.y); ++r) {
        total = merge<kBackward>(total, row_states[r * row_width + threadIdx.x * kPack + i]);
      }
      store_partial(partials, splits, channels, split, channel + i, total);
    }
  }
}

// The finalize kernels' block: kFinalizeChannels consecutive channels (threadIdx.x) x kFinalizeRows rows of splits
// (threadIdx.y), grid ceil(channels / kFinalizeChannels). A warp reads 4 splits x 8 channels per plane: four whole
// 32-byte sectors of the [splits][channels] layout.
constexpr int kFinalizeChannels = 8;
constexpr int kFinalizeRows = kThreads / kFinalizeChannels;
constexpr dim3 kFinalizeBlock(kFinalizeChannels, kFinalizeRows);
inline unsigned finalize_grid(int64_t channels) {
  return static_cast<unsigned>((channels + kFinalizeChannels - 1) / kFinalizeChannels);
}

// The splits of channel blockIdx.x * kFinalizeChannels + threadIdx.x merged in a fixed tree: row y merges splits
// y, y + kFinalizeRows, ... in order, the four rows of a warp merge by shuffles, then the warps in order. One thread
// per channel walking all splits was a chain of ~530 dependent L2 loads (the 256 channels of a large NHWC batch).
// Every thread of the block must call it; the total is meaningful where threadIdx.y == 0 and the channel exists.
template <bool kBackward>
__device__ __forceinline__ State merged_partials(const float* __restrict__ partials, int64_t splits,
                                                 int64_t channels) {
  constexpr int kRowsPerWarp = 32 / kFinalizeChannels;
  __shared__ State warp_totals[kFinalizeRows / kRowsPerWarp][kFinalizeChannels];
  const int64_t channel = blockIdx.x * int64_t{kFinalizeChannels} + threadIdx.x;
  State total;
  if (channel < channels) {
    // kBatch splits' loads issued before their merges: a merge's division has a slow-path call, which the
    // compiler does not move loads across, so merging as it loads would wait for L2 once per split.
    constexpr int kBatch = 4;
    const int64_t plane = splits * channels;
    for (int64_t first = threadIdx.y; first < splits; first += kBatch * kFinalizeRows) {
      State batch[kBatch];  // empty states past the last split merge as nothing
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t k = first + u * kFinalizeRows, at = k * channels + channel;
        if (k < splits) batch[u] = State{partials[at], partials[plane + at], partials[2 * plane + at]};
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) total = merge<kBackward>(total, batch[u]);
    }
  }
  // lane = threadIdx.x + kFinalizeChannels * (threadIdx.y % kRowsPerWarp): the upper lane bits are the rows
  total = shuffle_merge<kBackward, kFinalizeChannels>(total);
  if (threadIdx.y % kRowsPerWarp == 0) warp_totals[threadIdx.y / kRowsPerWarp][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0) {
#pragma unroll
    for (int w = 1; w < kFinalizeRows / kRowsPerWarp; ++w) {
      total = merge<kBackward>(total, warp_totals[w][threadIdx.x]);
    }
  }
  return total;
}

// `vectors` = numel / kPack work items, visited last to first in the partial kernels' order: NCHW (channel, batch,
// spatial vector) with spatial % kPack == 0; NHWC the memory order with channels % kPack == 0.
template <typename T, int kPack, bool kBackward, bool kChannelsLast, typename Index>
__global__ void channel_affine(const T* __restrict__ first, const T* __restrict__ second, T* __restrict__ out,
                               const float* __restrict__ coefficients, Index vectors, int64_t channels,
                               int64_t spatial, FastDivmod per_channel_vectors, FastDivmod spatial_vectors,
                               FastDivmod channel_vectors) {
  for (Index item = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; item < vectors;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index v = vectors - 1 - item;
    Index offset;
    float k0[kPack], k1[kPack], k2[kPack];
    if constexpr (kChannelsLast) {
      Index cv;
      channel_vectors.divmod(v, cv);
      offset = v * kPack;
      // Vector loads: channels % kPack == 0 and the workspace is 256-byte aligned, so every row of coefficients
      // starts on a kPack-float boundary.
      const Index c = cv * kPack;
      load_floats<kPack>(coefficients + c, k0);
      load_floats<kPack>(coefficients + channels + c, k1);
      if constexpr (kBackward) load_floats<kPack>(coefficients + 2 * channels + c, k2);
    } else {
      Index rest, sv;
      const Index c = per_channel_vectors.divmod(v, rest);
      const Index n = spatial_vectors.divmod(rest, sv);
      offset = (n * static_cast<Index>(channels) + c) * static_cast<Index>(spatial) + sv * kPack;
      const float a = coefficients[c], b = coefficients[channels + c];
      const float c2 = kBackward ? coefficients[2 * channels + c] : 0.0f;
#pragma unroll
      for (int i = 0; i < kPack; ++i) {
        k0[i] = a;
        k1[i] = b;
        k2[i] = c2;
      }
    }
    float values[kPack], result[kPack];
    load_floats<kPack>(first + offset, values);
    if constexpr (kBackward) {
      float xv[kPack];
      load_floats<kPack>(second + offset, xv);
#pragma unroll
      for (int i = 0; i < kPack; ++i) result[i] = values[i] * k0[i] + xv[i] * k1[i] + k2[i];
    } else {
#pragma unroll
      for (int i = 0; i < kPack; ++i) result[i] = values[i] * k0[i] + k1[i];
    }
    store_floats<kPack>(out + offset, result);
  }
}

// Launches the partial kernel of the layout; `T`/`kPack` already bound.
template <typename T, int kPack, bool kBackward, typename Index>
void launch_partials(const T* x, const T* dy, const float* mean, const float* invstd, float* partials,
                     const Shape& shape, const Split& split, cudaStream_t stream) {
  if (shape.layout == Layout::NCHW) {
    const int64_t spatial_vectors = shape.spatial / kPack;
    channel_partials_nchw<T, kPack, kBackward, Index><<<static_cast<unsigned>(shape.channels * split.splits),
                                                        kThreads, 0, stream>>>(
        x, dy, mean, invstd, partials, shape.channels, shape.spatial, FastDivmod(spatial_vectors),
        shape.batch * spatial_vectors, split.splits);
  } else {
    const dim3 block(split.lanes, kThreads / split.lanes);
    const std::size_t shared = sizeof(State) * kThreads * kPack;
    channel_partials_nhwc<T, kPack, kBackward, Index><<<static_cast<unsigned>(split.tiles * split.splits), block,
                                                        shared, stream>>>(
        x, dy, mean, invstd, partials, shape.channels, shape.count(), split.tiles, split.splits);
  }
}

template <typename T, int kPack, bool kBackward, typename Index>
void launch_affine(const T* first, const T* second, T* out, const float* coefficients, const Shape& shape,
                   cudaStream_t stream) {
  const int64_t vectors = shape.numel() / kPack;
  const int blocks = static_cast<int>(std::min<int64_t>((vectors + kThreads - 1) / kThreads, kMaxBlocks));
  const int64_t spatial_vectors = shape.spatial / kPack;
  const FastDivmod per_channel(shape.batch * spatial_vectors), spatial(spatial_vectors),
      channel_vectors(shape.channels / kPack);
  if (shape.layout == Layout::NHWC) {
    channel_affine<T, kPack, kBackward, true, Index><<<blocks, kThreads, 0, stream>>>(
        first, second, out, coefficients, static_cast<Index>(vectors), shape.channels, shape.spatial, per_channel,
        spatial, channel_vectors);
  } else {
    channel_affine<T, kPack, kBackward, false, Index><<<blocks, kThreads, 0, stream>>>(
        first, second, out, coefficients, static_cast<Index>(vectors), shape.channels, shape.spatial, per_channel,
        spatial, channel_vectors);
  }
}

}  // namespace ge2::batch_norm
