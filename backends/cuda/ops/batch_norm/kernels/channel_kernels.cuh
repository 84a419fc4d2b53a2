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
    const float n = p.a + q.a;
    if (n == 0.0f) return p;
    const float delta = q.b - p.b, weight = q.a / n;
    return {n, p.b + delta * weight, p.c + q.c + delta * delta * p.a * weight};
  }
}

// One element into a state; forward: x only; backward: dy and xhat's constants.
template <bool kBackward>
__device__ __forceinline__ void accumulate(State& s, float x, float dy, float mean, float invstd) {
  if constexpr (kBackward) {
    s.a += dy;
    s.b += dy * (x - mean) * invstd;
  } else {
    s.a += 1.0f;
    const float delta = x - s.b;
    s.b += delta / s.a;
    s.c += delta * (x - s.b);
  }
}

template <bool kBackward>
__device__ __forceinline__ State shuffle_merge(State s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
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
    float xv[kPack], gv[kPack] = {};
    load_floats<kPack>(x + offset, xv);
    if constexpr (kBackward) load_floats<kPack>(dy + offset, gv);
#pragma unroll
    for (int i = 0; i < kPack; ++i) accumulate<kBackward>(s, xv[i], gv[i], m, s_inv);
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
    for (Index r = begin + threadIdx.y; r < end; r += blockDim.y) {
      const Index offset = r * static_cast<Index>(channels) + static_cast<Index>(channel);
      float xv[kPack], gv[kPack] = {};
      load_floats<kPack>(x + offset, xv);
      if constexpr (kBackward) load_floats<kPack>(dy + offset, gv);
#pragma unroll
      for (int i = 0; i < kPack; ++i) accumulate<kBackward>(s[i], xv[i], gv[i], m[i], s_inv[i]);
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

// Adds up the splits of one channel in order.
template <bool kBackward>
__device__ __forceinline__ State merged_partials(const float* partials, int64_t splits, int64_t channels,
                                                 int64_t channel) {
  const int64_t plane = splits * channels;
  State total;
  for (int64_t k = 0; k < splits; ++k) {
    const int64_t at = k * channels + channel;
    total = merge<kBackward>(total, State{partials[at], partials[plane + at], partials[2 * plane + at]});
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
#pragma unroll
      for (int i = 0; i < kPack; ++i) {
        const Index c = cv * kPack + i;
        k0[i] = coefficients[c];
        k1[i] = coefficients[channels + c];
        k2[i] = kBackward ? coefficients[2 * channels + c] : 0.0f;
      }
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
