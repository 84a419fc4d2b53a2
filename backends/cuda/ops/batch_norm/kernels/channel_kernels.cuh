// The two kernel shapes batch_norm's forward and backward share:
//  - channel_partials_*: per-(split, channel) partial reductions of x (forward: Welford count/mean/M2) or of dy and
//    x (backward: sum dy, sum dy * xhat), merged inside a block in a fixed order, written as [3][splits][channels];
//  - channel_affine: the elementwise pass, y = x * k0 + k1 (forward) or dx = dy * k0 + x * k1 + k2 (backward) with
//    per-channel coefficients [3][channels]. It walks the array in the reverse of the partial kernels' order, so
//    that it first meets the data they read last, which may still be in L2.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../api.hpp"
#include "dtype.hpp"
#include "fast_divmod.hpp"
#include "float_access.hpp"
#include "streaming_access.hpp"

namespace ge2::batch_norm {

constexpr int kThreads = 256;
// Work items (16-byte vectors, or rows of them) a thread loads before it uses any: 4 in the forward (x), 2 in the
// backward (x and dy, the same bytes). With 4 blocks of 256 threads per SM that is 64 KiB in flight per SM,
// several times what the H100's DRAM latency needs, within 64 registers.
template <bool kBackward>
constexpr int kInFlight = kBackward ? 2 : 4;
// The affine grid is one wave at the occupancy the compiler reaches; >= 3 blocks of 256 threads per SM (<= 80
// registers) keep 48 KiB in flight per SM (the 8-wide bfloat16 passes spill at 64).
constexpr int kAffineBlocksPerSm = 3;
// The partial kernels' grids are launcher.cu's kTargetBlocks (4 per SM) rounded up to whole channel tiles (NHWC:
// one tile for <= 256 16-bit channels) or channels (NCHW: 768 blocks for 256 channels): registers capped so that
// they fit at once (bfloat16 NHWC rows would take 72 otherwise, NCHW vectors 48).
constexpr int kPartialBlocksPerSmNhwc = 4;
constexpr int kPartialBlocksPerSmNchw = 6;

// A pack's values as float32 and back; bfloat16 two at a time (one paired conversion per 32-bit word).
template <typename T, int kN>
__device__ __forceinline__ void unpack_floats(const Pack<T, kN>& pack, float* values) {
  if constexpr (kN % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      const float2 pair = __bfloat1622float2(__nv_bfloat162(pack.values[i], pack.values[i + 1]));
      values[i] = pair.x;
      values[i + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) values[i] = to_float(pack.values[i]);
  }
}

template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> pack_floats(const float* values) {
  Pack<T, kN> pack;
  if constexpr (kN % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(values[i], values[i + 1]);
      pack.values[i] = pair.x;
      pack.values[i + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) pack.values[i] = from_float<T>(values[i]);
  }
  return pack;
}

// kItems packs of x (and of dy, backward) at offset_of(0 .. kItems - 1), every load issued before any is used.
template <typename T, int kPack, int kItems, bool kBackward, typename OffsetOf>
__device__ __forceinline__ void load_items(const T* x, const T* dy, OffsetOf offset_of, Pack<T, kPack> (&xr)[kItems],
                                           Pack<T, kPack> (&gr)[kItems]) {
#pragma unroll
  for (int u = 0; u < kItems; ++u) {
    const auto offset = offset_of(u);
    xr[u] = load_pack<T, kPack>(x + offset);
    if constexpr (kBackward) gr[u] = load_pack<T, kPack>(dy + offset);
  }
}

// The backward's sums over loaded packs, item by item and element by element, in order: accumulate(i, x, dy) for
// element i of each pack.
template <typename T, int kPack, int kItems, typename Accumulate>
__device__ __forceinline__ void accumulate_items(const Pack<T, kPack> (&xr)[kItems], const Pack<T, kPack> (&gr)[kItems],
                                                 Accumulate accumulate) {
#pragma unroll
  for (int u = 0; u < kItems; ++u) {
    float xv[kPack], gv[kPack];
    unpack_floats<T, kPack>(xr[u], xv);
    unpack_floats<T, kPack>(gr[u], gv);
#pragma unroll
    for (int i = 0; i < kPack; ++i) accumulate(i, xv[i], gv[i]);
  }
}

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

// Forward, NHWC: kRows rows' values of kPack channels reduced in registers (1 / kRows is exact) and Chan-merged into
// the states with one division per batch (every state of a thread has seen the same rows, so shares the counts).
template <int kPack, int kRows, typename T>
__device__ __forceinline__ void welford_rows(State* s, const Pack<T, kPack>* rows) {
  const float count = s[0].a + kRows, weight = kRows / count;
#pragma unroll
  for (int i = 0; i < kPack; ++i) {
    float values[kRows], sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      values[r] = to_float(rows[r].values[i]);
      sum += values[r];
    }
    const float mean = sum * (1.0f / kRows);
    float m2 = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) m2 += (values[r] - mean) * (values[r] - mean);
    const float delta = mean - s[i].b;
    s[i].c += m2 + delta * delta * s[i].a * weight;
    s[i].b += delta * weight;
    s[i].a = count;
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
// [batch][spatial], handled as vectors of kPack along spatial (spatial % kPack == 0). A thread loads kInFlight
// vectors (blockDim apart) before it reduces them: the forward as one Chan merge of kItems * kPack values, the
// backward in the order of the one-at-a-time loop that takes the last vectors of the range.
template <typename T, int kPack, bool kBackward, typename Index>
__global__ void __launch_bounds__(kThreads, kPartialBlocksPerSmNchw) channel_partials_nchw(
    const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ mean,
    const float* __restrict__ invstd, float* __restrict__ partials, int64_t channels, int64_t spatial,
    FastDivmod spatial_vectors, int64_t per_channel, int64_t splits) {
  __shared__ State warp_states[kThreads / 32];
  const int64_t channel = blockIdx.x / splits, split = blockIdx.x % splits;
  const int64_t chunk = (per_channel + splits - 1) / splits;
  const Index begin = static_cast<Index>(split * chunk);
  const Index end = static_cast<Index>(min(per_channel, (split + 1) * chunk));
  const float m = kBackward ? mean[channel] : 0.0f, s_inv = kBackward ? invstd[channel] : 0.0f;
  constexpr int kItems = kInFlight<kBackward>;
  const auto offset_of = [&](Index v) {
    Index sv;
    const Index n = spatial_vectors.divmod(v, sv);
    return (n * static_cast<Index>(channels) + static_cast<Index>(channel)) * static_cast<Index>(spatial) + sv * kPack;
  };
  State s;
  const Index step = blockDim.x;
  Index v = begin + threadIdx.x;
  for (; v + (kItems - 1) * step < end; v += kItems * step) {
    Pack<T, kPack> xr[kItems], gr[kItems];
    load_items<T, kPack, kItems, kBackward>(x, dy, [&](int u) { return offset_of(v + u * step); }, xr, gr);
    if constexpr (kBackward) {
      accumulate_items<T, kPack, kItems>(xr, gr,
                                         [&](int, float xv, float gv) { accumulate_gradient(s, xv, gv, m, s_inv); });
    } else {
      float values[kItems * kPack];
#pragma unroll
      for (int u = 0; u < kItems; ++u) unpack_floats<T, kPack>(xr[u], values + u * kPack);
      s = merge_values<kItems * kPack>(s, values);
    }
  }
  for (; v < end; v += step) {
    const Index offset = offset_of(v);
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
__global__ void __launch_bounds__(kThreads, kPartialBlocksPerSmNhwc) channel_partials_nhwc(
    const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ mean,
    const float* __restrict__ invstd, float* __restrict__ partials, int64_t channels, int64_t rows, int64_t tiles,
    int64_t splits) {
  extern __shared__ State row_states[];  // [blockDim.y][blockDim.x * kPack]
  const int64_t tile = blockIdx.x % tiles, split = blockIdx.x / tiles;
  const int64_t channel = (tile * blockDim.x + threadIdx.x) * kPack;
  const bool active = channel < channels;
  const int64_t chunk = (rows + splits - 1) / splits;
  const Index begin = static_cast<Index>(split * chunk), end = static_cast<Index>(min(rows, (split + 1) * chunk));
  constexpr int kItems = kInFlight<kBackward>;
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
    // kInFlight rows' loads issued before any is accumulated (the grid is 4 blocks per SM, and one 16-byte load in
    // flight per thread left DRAM latency exposed); the forward merges them as one batch (one division), the
    // backward accumulates them row by row, in order.
    const Index step = blockDim.y;
    Index r = begin + threadIdx.y;
    for (; r + (kItems - 1) * step < end; r += kItems * step) {
      Pack<T, kPack> xr[kItems], gr[kItems];
      load_items<T, kPack, kItems, kBackward>(
          x, dy, [&](int u) { return (r + u * step) * static_cast<Index>(channels) + static_cast<Index>(channel); },
          xr, gr);
      if constexpr (kBackward) {
        accumulate_items<T, kPack, kItems>(
            xr, gr, [&](int i, float xv, float gv) { accumulate_gradient(s[i], xv, gv, m[i], s_inv[i]); });
      } else {
        welford_rows<kPack, kItems>(s, xr);
      }
    }
    for (; r < end; r += step) {
      const Index offset = r * static_cast<Index>(channels) + static_cast<Index>(channel);
      float xv[kPack];
      load_floats<kPack>(x + offset, xv);
      if constexpr (kBackward) {
        float gv[kPack];
        load_floats<kPack>(dy + offset, gv);
#pragma unroll
        for (int i = 0; i < kPack; ++i) accumulate_gradient(s[i], xv[i], gv[i], m[i], s_inv[i]);
      } else {
        welford_row<kPack>(s, xv);
      }
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

// The affine pass over `vectors` = numel / kPack work items, visited last to first in the partial kernels' order
// (NCHW: channel, batch, spatial vector with spatial % kPack == 0; NHWC: the memory order with channels % kPack
// == 0). Thread t takes items t, t + stride, ... and loads kInFlight of them (streaming: their last use)
// before it computes any; results are stored streaming too. `left` = vectors - (the batch's first item); item u of
// the batch exists if u * stride < left. k holds kRows (2 forward, 3 backward) coefficient rows of kPack values:
// once for the whole batch if kShared, else per item (row u * kRows + j).
template <typename T, int kPack, bool kBackward, bool kShared, typename Index>
__device__ __forceinline__ void affine_batch(const T* __restrict__ first, const T* __restrict__ second,
                                             T* __restrict__ out, Index left, Index stride, const Index* offsets,
                                             const float (*k)[kPack]) {
  constexpr int kRows = kBackward ? 3 : 2, kItems = kInFlight<kBackward>;
  Pack<T, kPack> a[kItems], b[kItems];
#pragma unroll
  for (int u = 0; u < kItems; ++u) {
    if (u * stride < left) {
      a[u] = load_streaming<T, kPack>(first + offsets[u]);
      if constexpr (kBackward) b[u] = load_streaming<T, kPack>(second + offsets[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < kItems; ++u) {
    if (u * stride < left) {
      const float(*ku)[kPack] = k + (kShared ? 0 : u * kRows);
      float values[kPack], others[kPack], result[kPack];
      unpack_floats<T, kPack>(a[u], values);
      if constexpr (kBackward) unpack_floats<T, kPack>(b[u], others);
#pragma unroll
      for (int i = 0; i < kPack; ++i) {
        result[i] = kBackward ? values[i] * ku[0][i] + others[i] * ku[1][i] + ku[2][i]
                              : values[i] * ku[0][i] + ku[1][i];
      }
      store_streaming<T, kPack>(out + offsets[u], pack_floats<T, kPack>(result));
    }
  }
}

// NHWC: `stride` is a multiple of the channel vectors (and vectors is one), so every item of a thread is the same
// channel vector: its coefficients are loaded once, and the index is one multiply. Threads from `stride` on idle.
template <typename T, int kPack, bool kBackward, typename Index>
__global__ void __launch_bounds__(kThreads, kAffineBlocksPerSm) channel_affine_nhwc(const T* __restrict__ first,
                                                                const T* __restrict__ second, T* __restrict__ out,
                                                                const float* __restrict__ coefficients, Index vectors,
                                                                Index stride, int64_t channels, Index channel_vectors) {
  const Index thread = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x;
  if (thread >= stride) return;
  // The channel vector of item vectors - 1 - thread (- j * stride): one division per thread.
  const Index c = (channel_vectors - 1 - thread % channel_vectors) * kPack;
  // Vector loads: channels % kPack == 0 and the workspace is 256-byte aligned, so every row of coefficients
  // starts on a kPack-float boundary.
  constexpr int kRows = kBackward ? 3 : 2, kItems = kInFlight<kBackward>;
  float k[kRows][kPack];
#pragma unroll
  for (int j = 0; j < kRows; ++j) load_floats<kPack>(coefficients + j * channels + c, k[j]);
  for (Index item = thread; item < vectors; item += kItems * stride) {
    const Index left = vectors - item;
    Index offsets[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) offsets[u] = (left - 1 - u * stride) * kPack;  // unused if out of range
    affine_batch<T, kPack, kBackward, true, Index>(first, second, out, left, stride, offsets, k);
  }
}

// NCHW: per item two multiply-high divisions (channel, then batch and spatial vector) and scalar coefficient loads
// (L1 hits: 8 or 12 bytes per 16 bytes of data).
template <typename T, int kPack, bool kBackward, typename Index>
__global__ void __launch_bounds__(kThreads, kAffineBlocksPerSm) channel_affine_nchw(const T* __restrict__ first,
                                                                const T* __restrict__ second, T* __restrict__ out,
                                                                const float* __restrict__ coefficients, Index vectors,
                                                                Index stride, int64_t channels, int64_t spatial,
                                                                FastDivmod per_channel_vectors,
                                                                FastDivmod spatial_vectors) {
  constexpr int kRows = kBackward ? 3 : 2, kItems = kInFlight<kBackward>;
  for (Index item = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; item < vectors;
       item += kItems * stride) {
    const Index left = vectors - item;
    Index offsets[kItems];
    float k[kRows * kItems][kPack];
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const Index v = u * stride < left ? left - 1 - u * stride : 0;  // item 0 stands in for a missing one
      Index rest, sv;
      const Index c = per_channel_vectors.divmod(v, rest);
      const Index n = spatial_vectors.divmod(rest, sv);
      offsets[u] = (n * static_cast<Index>(channels) + c) * static_cast<Index>(spatial) + sv * kPack;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const float value = __ldg(coefficients + j * channels + c);
#pragma unroll
        for (int i = 0; i < kPack; ++i) k[u * kRows + j][i] = value;
      }
    }
    affine_batch<T, kPack, kBackward, false, Index>(first, second, out, left, stride, offsets, k);
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

// Blocks of kThreads that `kernel` keeps resident on the whole device at once (one full wave), queried once per
// kernel (a static of the caller's instantiation) on the device current at the first launch.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel) {
  int device = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  return int64_t{std::max(sms, 1)} * std::max(per_sm, 1);
}

// At most one wave, each thread with at least one round of the forward (4 items).
inline int64_t affine_blocks(int64_t vectors, int64_t wave) {
  constexpr int64_t kRound = int64_t{kThreads} * kInFlight<false>;
  return std::clamp<int64_t>((vectors + kRound - 1) / kRound, 1, wave);
}

template <typename T, int kPack, bool kBackward, typename Index>
void launch_affine(const T* first, const T* second, T* out, const float* coefficients, const Shape& shape,
                   cudaStream_t stream) {
  const int64_t vectors = shape.numel() / kPack;
  if (shape.layout == Layout::NHWC) {
    const auto kernel = channel_affine_nhwc<T, kPack, kBackward, Index>;
    static const int64_t wave = resident_blocks(kernel);
    const int64_t channel_vectors = shape.channels / kPack;
    // Enough threads for one of each channel vector; the stride is the largest multiple of them that fits.
    const int64_t blocks = std::max(affine_blocks(vectors, wave), (channel_vectors + kThreads - 1) / kThreads);
    const int64_t threads = blocks * kThreads, stride = threads - threads % channel_vectors;
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        first, second, out, coefficients, static_cast<Index>(vectors), static_cast<Index>(stride), shape.channels,
        static_cast<Index>(channel_vectors));
  } else {
    const auto kernel = channel_affine_nchw<T, kPack, kBackward, Index>;
    static const int64_t wave = resident_blocks(kernel);
    const int64_t blocks = affine_blocks(vectors, wave), spatial_vectors = shape.spatial / kPack;
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        first, second, out, coefficients, static_cast<Index>(vectors), static_cast<Index>(blocks * kThreads),
        shape.channels, shape.spatial, FastDivmod(shape.batch * spatial_vectors), FastDivmod(spatial_vectors));
  }
}

}  // namespace ge2::batch_norm
