// depthwise: GE2's direct depthwise convolution (groups == C == K: one filter per channel), forward only, NCHW or
// NHWC, float32/float16/bfloat16. Taps accumulated in float32, then the epilogue (bias, residual, activation, clip)
// in float32, y rounded once. It exists for the 16-bit depthwise convolutions with a fused epilogue that nothing else
// ran fast: cuDNN's runtime fusion has no engine for them, legacy cuDNN would round before the epilogue, and
// im2col_gemm took 21.4 of EfficientNet-B0's 22.7 ms on the H200 (batch 32, float16).
// Three kernels, the first that applies:
// - depthwise_nhwc_tiled (16-bit NHWC, C % 8 == 0, 3x3 or 5x5, stride 1 or 2, no dilation, conv2d's activations:
//   every depthwise conv of EfficientNet and MobileNet): a block stages an output tile's input window (halo
//   included, zeros outside the image) for up to 64 channels in shared memory with 16-byte cp.async, all copies in
//   flight at once; a thread then owns a channel pair, holds its filters in registers and computes strips of 4
//   neighbouring outputs (two rows of them for 3x3), each input pair read once per strip. One instantiation per activation. Its
//   predecessor (depthwise_nhwc_vec8 alone: a thread per 8 channels of one pixel, every tap a dependent 16-byte
//   global load, 64-bit index divisions, spills) ran EfficientNet-B0's 16 depthwise convs at ~8x their memory time
//   (0.965 of 2.164 ms, float16 batch 32, H200, session 33); its first version (the activation a runtime switch
//   inlined for each of a strip's 8 outputs, 64-channel tiles only) at ~5x (0.649 of 1.757 ms, session 33); this
//   one takes 0.323 ms for the 16 (CUDA-graph replay of each alone, H200, session 34), the 5x5 layers 0.18 of it at
//   0.5-1.1 TB/s (by their SASS instruction counts ~1.5 issued per cycle per SM: not profiled; 3 blocks of ~7 warps).
// - depthwise_nhwc_vec8 (16-bit NHWC, C % 8 == 0, other filters): a thread takes 8 neighbouring channels of one
//   output pixel, every tap one 16-byte load of x; the block's filters sit in shared memory tap-major (as floats).
// - depthwise_forward (everything else): a thread per output.
#include <algorithm>
#include <cstdint>

#include "api.hpp"
#include "cp_async.hpp"
#include "status.hpp"

namespace ge2::conv2d {
namespace {

constexpr int kThreads = 256;

struct Depthwise {
  int64_t c, h, w, p, q;
  int r, s, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  bool nhwc;
};

template <typename T>
__global__ void depthwise_forward(Depthwise d, const T* __restrict__ x, const T* __restrict__ w,
                                  const T* __restrict__ bias, const T* __restrict__ residual, T* __restrict__ y,
                                  Act act, float slope, float clip_low, float clip_high, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t channel, n, out_p, out_q;
    if (d.nhwc) {  // y [N, P, Q, C]
      channel = e % d.c;
      const int64_t pixel = e / d.c;
      out_q = pixel % d.q;
      out_p = pixel / d.q % d.p;
      n = pixel / (d.q * d.p);
    } else {  // y [N, C, P, Q]
      out_q = e % d.q;
      out_p = e / d.q % d.p;
      channel = e / (d.q * d.p) % d.c;
      n = e / (d.q * d.p * d.c);
    }
    const T* filter = w + channel * d.r * d.s;  // [K, R, S, 1] (NHWC) and [K, 1, R, S] (NCHW) alike
    float acc = 0.0f;
    for (int tap_r = 0; tap_r < d.r; ++tap_r) {
      const int64_t in_h = out_p * d.stride_h - d.pad_top + int64_t(tap_r) * d.dilation_h;
      if (in_h < 0 || in_h >= d.h) continue;
      for (int tap_s = 0; tap_s < d.s; ++tap_s) {
        const int64_t in_w = out_q * d.stride_w - d.pad_left + int64_t(tap_s) * d.dilation_w;
        if (in_w < 0 || in_w >= d.w) continue;
        const int64_t at = d.nhwc ? ((n * d.h + in_h) * d.w + in_w) * d.c + channel
                                  : ((n * d.c + channel) * d.h + in_h) * d.w + in_w;
        acc += to_float(x[at]) * to_float(filter[tap_r * d.s + tap_s]);
      }
    }
    if (bias != nullptr) acc += to_float(bias[channel]);
    if (residual != nullptr) acc += to_float(residual[e]);
    y[e] = from_float<T>(clip_value(apply_act(act, acc, slope), clip_low, clip_high));
  }
}

constexpr int kVector = 8;  // 16-bit channels in one 16-byte load
constexpr int64_t kSharedBytes = 48 << 10;  // what a launch may take without opting in

template <typename T>
__global__ void __launch_bounds__(kThreads) depthwise_nhwc_vec8(Depthwise d, const T* __restrict__ x,
                                                                const T* __restrict__ w, const T* __restrict__ bias,
                                                                const T* __restrict__ residual, T* __restrict__ y,
                                                                Act act, float slope, float clip_low, float clip_high,
                                                                int64_t pixels) {
  extern __shared__ float filters[];  // [R * S][the block's channels]: one tap's weights side by side
  const int taps = d.r * d.s;
  const int block_channels = blockDim.x * kVector;
  const int64_t first_channel = int64_t(blockIdx.x) * block_channels;
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < taps * block_channels; i += blockDim.x * blockDim.y) {
    const int local = i / taps, tap = i % taps;  // consecutive i: one channel's taps, read coalesced from [K, R, S]
    const int64_t channel = first_channel + local;
    filters[tap * block_channels + local] = channel < d.c ? to_float(w[channel * taps + tap]) : 0.0f;
  }
  __syncthreads();
  const int64_t channel = first_channel + threadIdx.x * kVector;
  if (channel >= d.c) return;
  float shift[kVector] = {};
  if (bias != nullptr) {
    const uint4 raw = *reinterpret_cast<const uint4*>(bias + channel);
    const T* values = reinterpret_cast<const T*>(&raw);
    for (int k = 0; k < kVector; ++k) shift[k] = to_float(values[k]);
  }
  for (int64_t pixel = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; pixel < pixels;
       pixel += int64_t(gridDim.y) * blockDim.y) {
    const int64_t out_q = pixel % d.q, out_p = pixel / d.q % d.p, n = pixel / (d.q * d.p);
    float acc[kVector] = {};
    for (int tap_r = 0; tap_r < d.r; ++tap_r) {
      const int64_t in_h = out_p * d.stride_h - d.pad_top + int64_t(tap_r) * d.dilation_h;
      if (in_h < 0 || in_h >= d.h) continue;
      const T* row = x + (n * d.h + in_h) * d.w * d.c + channel;
      for (int tap_s = 0; tap_s < d.s; ++tap_s) {
        const int64_t in_w = out_q * d.stride_w - d.pad_left + int64_t(tap_s) * d.dilation_w;
        if (in_w < 0 || in_w >= d.w) continue;
        const uint4 raw = *reinterpret_cast<const uint4*>(row + in_w * d.c);
        const T* values = reinterpret_cast<const T*>(&raw);
        const float* weight = filters + (tap_r * d.s + tap_s) * block_channels + threadIdx.x * kVector;
        for (int k = 0; k < kVector; ++k) acc[k] += to_float(values[k]) * weight[k];
      }
    }
    const int64_t at = pixel * d.c + channel;
    float added[kVector] = {};
    if (residual != nullptr) {
      const uint4 raw = *reinterpret_cast<const uint4*>(residual + at);
      const T* values = reinterpret_cast<const T*>(&raw);
      for (int k = 0; k < kVector; ++k) added[k] = to_float(values[k]);
    }
    uint4 out;
    T* result = reinterpret_cast<T*>(&out);
    for (int k = 0; k < kVector; ++k) {
      result[k] = from_float<T>(clip_value(apply_act(act, acc[k] + shift[k] + added[k], slope), clip_low, clip_high));
    }
    *reinterpret_cast<uint4*>(y + at) = out;
  }
}

constexpr int kStrip = 4;          // neighbouring outputs (along Q) a thread computes from one pass over its inputs
// Output rows of a task: with 2, an input row read (and converted) once serves both, ~25% fewer instructions per
// output for 3x3 (64 registers); 5x5 filters keep 1 (2 rows take 106 registers, 2 blocks of 256 threads per SM).
__host__ __device__ constexpr int task_rows(int r) { return r == 3 ? 2 : 1; }
constexpr int kTileChannels = 64;  // a block's channels: a warp's 32 channel pairs, one 128-byte row per pixel
// Under 48 KB (no opt-in), and small enough for several blocks per SM, so one block's copies overlap another's math.
constexpr int64_t kTileSharedBytes = 40 << 10;

// A block's outputs: rows x cols (cols a multiple of kStrip) of one image and up to kTileChannels channels, and the
// input window they read.
struct Tile {
  int rows, cols, in_rows, in_cols, channels, tiles_q;
};

// The tiled kernel's activation, fixed at compile time: with the runtime switch, each of a strip's 8 outputs
// inlined every activation's code (erf, tanh, an IEEE division: ~2,000 instructions, a spill in the 3x3 kernel).
// silu's sigmoid is two MUFU instructions, the hardware exponential and reciprocal (~2 float32 ulp, far below y's
// 16-bit rounding); exp(-z) overflowing to inf (z < -88) gives 0, silu's limit.
template <Act kAct>
__device__ __forceinline__ float tiled_act(float z, float slope) {
  if constexpr (kAct == Act::Silu) {
    float exponential, reciprocal;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(exponential) : "f"(z * -1.4426950408889634f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(reciprocal) : "f"(1.0f + exponential));
    return z * reciprocal;
  } else {
    return apply_act(kAct, z, slope);
  }
}

template <typename T>
__device__ __forceinline__ float2 load_pair(const T* at) {  // two neighbouring channels, one 4-byte access
  const uint32_t raw = *reinterpret_cast<const uint32_t*>(at);
  const T* values = reinterpret_cast<const T*>(&raw);
  return make_float2(to_float(values[0]), to_float(values[1]));
}

// Blocks per SM the register budget must allow: a block's copies overlap other blocks' math, so occupancy counts
// more than the extra registers the unrolled strips would take (5x5: 96 without the bound, 2 blocks per SM).
constexpr int tiled_min_blocks(int r) { return r == 3 ? 4 : 3; }

// grid (spatial tiles, channel tiles, N); block (channel pairs of the tile, thread groups). R x S filters, stride
// kStride both ways, no dilation; C % 8 == 0, x 16-byte aligned, w/bias/residual/y 4-byte aligned. The window's
// pixels sit kTileChannels apart in shared memory whatever the tile's channels, so a strip's reads are one base
// address plus compile-time offsets.
template <typename T, int R, int S, int kStride, Act kAct>
__global__ void __launch_bounds__(kThreads, tiled_min_blocks(R))
    depthwise_nhwc_tiled(Depthwise d, Tile tile, const T* __restrict__ x, const T* __restrict__ w,
                         const T* __restrict__ bias, const T* __restrict__ residual, T* __restrict__ y, float slope,
                         float clip_low, float clip_high) {
  extern __shared__ __align__(16) unsigned char shared[];
  T* window = reinterpret_cast<T*>(shared);  // [in_rows][in_cols][kTileChannels], the tile's channels first
  // [R * S][tile.channels] floats: a thread's two channels of a tap are one conflict-free 8-byte read
  float* filters = reinterpret_cast<float*>(shared + sizeof(T) * tile.in_rows * tile.in_cols * kTileChannels);
  const int64_t n = blockIdx.z;
  const int first_p = blockIdx.x / tile.tiles_q * tile.rows, first_q = blockIdx.x % tile.tiles_q * tile.cols;
  const int64_t first_channel = int64_t(blockIdx.y) * tile.channels;
  const int thread = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  {
    // threads is a multiple of the vectors per pixel (blockDim.x = 4 x vectors): each thread keeps one vector and
    // walks pixels `step` apart, its window row and column advanced without divisions
    const int vectors = tile.channels / kVector, vector = thread % vectors, step = threads / vectors;
    const int64_t channel = first_channel + vector * kVector;
    const int64_t top = int64_t(first_p) * kStride - d.pad_top, left = int64_t(first_q) * kStride - d.pad_left;
    int row = thread / vectors / tile.in_cols, col = thread / vectors % tile.in_cols;
    for (int pixel = thread / vectors; pixel < tile.in_rows * tile.in_cols; pixel += step) {
      const int64_t in_h = top + row, in_w = left + col;
      const bool inside = in_h >= 0 && in_h < d.h && in_w >= 0 && in_w < d.w && channel < d.c;
      const T* src = inside ? x + ((n * d.h + in_h) * d.w + in_w) * d.c + channel : x;
      cp_async_16(smem_address(window + pixel * kTileChannels + vector * kVector), reinterpret_cast<uint64_t>(src),
                  inside);
      for (col += step; col >= tile.in_cols; col -= tile.in_cols) ++row;
    }
    cp_async_commit();
  }
  constexpr int kTaps = R * S;
  for (int i = thread; i < kTaps * tile.channels; i += threads) {  // consecutive i: one channel's taps, coalesced
    const int local = i / kTaps, tap = i % kTaps;
    const int64_t channel = first_channel + local;
    filters[tap * tile.channels + local] = channel < d.c ? to_float(w[channel * kTaps + tap]) : 0.0f;
  }
  cp_async_wait_all();
  __syncthreads();

  const int64_t channel = first_channel + 2 * threadIdx.x;
  if (channel >= d.c) return;  // the last channel tile's unused lanes (no barrier follows)
  float2 weight[kTaps];
#pragma unroll
  for (int tap = 0; tap < kTaps; ++tap) {
    weight[tap] = *reinterpret_cast<const float2*>(filters + tap * tile.channels + 2 * threadIdx.x);
  }
  const float2 shift = bias != nullptr ? load_pair(bias + channel) : make_float2(0.0f, 0.0f);
  const bool clipped = clip_low > -INFINITY || clip_high < INFINITY;  // the same for every thread: no divergence
  constexpr int kWindowCols = (kStrip - 1) * kStride + S;  // the input columns one strip reads per filter row
  constexpr int kTaskRows = task_rows(R);
  constexpr int kWindowRows = (kTaskRows - 1) * kStride + R;  // the input rows one task reads
  // a task is kTaskRows x kStrip outputs (a band of rows, a strip of columns) of the tile, the image's last tiles
  // trimmed to the tasks inside it (56 columns: a last tile of 8 in 16 computes 2 strips, not 4); a thread's tasks
  // are blockDim.y apart, walked without divisions
  const int rows = min(tile.rows, static_cast<int>(d.p) - first_p), bands = (rows + kTaskRows - 1) / kTaskRows;
  const int strips = (min(tile.cols, static_cast<int>(d.q) - first_q) + kStrip - 1) / kStrip;
  const int window_row = tile.in_cols * kTileChannels;
  for (int band = threadIdx.y / strips, strip = threadIdx.y % strips; band < bands;) {
    const int row = band * kTaskRows;
    const T* first_input = window + (row * kStride * tile.in_cols + strip * kStrip * kStride) * kTileChannels +
                           2 * threadIdx.x;  // the task's top-left input
    float2 acc[kTaskRows][kStrip] = {};
#pragma unroll
    for (int in_r = 0; in_r < kWindowRows; ++in_r) {
      const T* in_row = first_input + in_r * window_row;
#pragma unroll
      for (int col = 0; col < kWindowCols; ++col) {
        const float2 value = load_pair(in_row + col * kTileChannels);
#pragma unroll
        for (int band_row = 0; band_row < kTaskRows; ++band_row) {
#pragma unroll
          for (int out = 0; out < kStrip; ++out) {
            const int r = in_r - band_row * kStride, s = col - out * kStride;  // resolved at compile time
            if (r >= 0 && r < R && s >= 0 && s < S) {
              acc[band_row][out].x += value.x * weight[r * S + s].x;
              acc[band_row][out].y += value.y * weight[r * S + s].y;
            }
          }
        }
      }
    }
    const int out_q = first_q + strip * kStrip, outputs = min(kStrip, static_cast<int>(d.q) - out_q);
#pragma unroll
    for (int band_row = 0; band_row < kTaskRows; ++band_row) {
      if (row + band_row >= rows) break;
      float2* sums = acc[band_row];
      const int64_t at = ((n * d.p + first_p + row + band_row) * d.q + out_q) * d.c + channel;
      if (residual != nullptr) {  // the same for every thread, as `clipped`
#pragma unroll
        for (int out = 0; out < kStrip; ++out) {
          if (out >= outputs) break;
          const float2 added = load_pair(residual + at + out * d.c);
          sums[out].x += added.x;
          sums[out].y += added.y;
        }
      }
#pragma unroll
      for (int out = 0; out < kStrip; ++out) {
        sums[out].x = tiled_act<kAct>(sums[out].x + shift.x, slope);
        sums[out].y = tiled_act<kAct>(sums[out].y + shift.y, slope);
      }
      if (clipped) {
#pragma unroll
        for (int out = 0; out < kStrip; ++out) {
          sums[out].x = clip_value(sums[out].x, clip_low, clip_high);
          sums[out].y = clip_value(sums[out].y, clip_low, clip_high);
        }
      }
#pragma unroll
      for (int out = 0; out < kStrip; ++out) {
        if (out >= outputs) break;
        T result[2] = {from_float<T>(sums[out].x), from_float<T>(sums[out].y)};
        *reinterpret_cast<uint32_t*>(y + at + out * d.c) = *reinterpret_cast<const uint32_t*>(result);
      }
    }
    for (strip += blockDim.y; strip >= strips; strip -= strips) ++band;
  }
}

bool aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}
bool aligned16(const void* pointer) { return aligned(pointer, 16); }

int64_t tile_shared_bytes(const Tile& t, int64_t element_bytes, int64_t taps) {
  return element_bytes * t.in_rows * t.in_cols * kTileChannels + int64_t(sizeof(float)) * taps * t.channels;
}

// All of C up to 64 channels, else the multiple of 8 from 64 down to 32 that pads C least, the largest on ties:
// 96 and 144 channels take tiles of 48, 672 of 56, where tiles of 64 left the last one part empty (its idle lanes
// still scheduled).
int choose_tile_channels(int64_t c) {
  if (c <= kTileChannels) return static_cast<int>(c);
  const auto padded = [c](int64_t channels) { return (c + channels - 1) / channels * channels; };
  int best = kTileChannels;
  for (int channels = kTileChannels - kVector; channels >= 32; channels -= kVector) {
    if (padded(channels) < padded(best)) best = channels;
  }
  return best;
}

// 8 x 16 outputs (fewer for a smaller image), halved (the longer side first) until the window and the filters fit
// kTileSharedBytes. The window holds whole bands of task_rows rows (a last band part outside the image reads
// zeros).
Tile choose_tile(const Shape& s, int64_t element_bytes) {
  Tile t{};
  const int band = task_rows(static_cast<int>(s.r));
  t.channels = choose_tile_channels(s.c);
  t.rows = static_cast<int>(std::min<int64_t>((s.p + band - 1) / band * band, 8));
  t.cols = static_cast<int>(std::min<int64_t>((s.q + kStrip - 1) / kStrip * kStrip, 16));
  const auto fit_window = [&] {
    t.in_rows = static_cast<int>(((t.rows + band - 1) / band * band - 1) * s.stride_h + s.r);
    t.in_cols = static_cast<int>((t.cols - 1) * s.stride_w + s.s);
  };
  fit_window();
  while (tile_shared_bytes(t, element_bytes, s.r * s.s) > kTileSharedBytes && (t.rows > 1 || t.cols > kStrip)) {
    if (t.cols > kStrip && (t.cols > t.rows || t.rows == 1)) {
      t.cols = std::max(kStrip, (t.cols / 2 + kStrip - 1) / kStrip * kStrip);
    } else {
      t.rows = (t.rows + 1) / 2;
    }
    fit_window();
  }
  t.tiles_q = static_cast<int>((s.q + t.cols - 1) / t.cols);
  return t;
}

// Whether depthwise_nhwc_tiled has an instantiation for the filter, stride and activation (and the grid fits the
// problem).
bool tiled_applies(const Shape& s, Act act) {
  const bool filter = s.r == s.s && (s.r == 3 || s.r == 5) && s.stride_h == s.stride_w &&
                      (s.stride_h == 1 || s.stride_h == 2) && s.dilation_h == 1 && s.dilation_w == 1;
  const bool instantiated = act == Act::None || act == Act::Relu || act == Act::Gelu || act == Act::Silu ||
                            act == Act::LeakyRelu;
  return filter && instantiated && s.n <= 65535 && (s.c + 31) / 32 <= 65535;
}

template <typename T, int R, int kStride, Act kAct>
void launch_tiled_act(const Depthwise& d, const Tile& t, const ForwardArgs& args, dim3 grid, dim3 block,
                      size_t shared, cudaStream_t stream) {
  depthwise_nhwc_tiled<T, R, R, kStride, kAct><<<grid, block, shared, stream>>>(
      d, t, static_cast<const T*>(args.x), static_cast<const T*>(args.w), static_cast<const T*>(args.bias),
      static_cast<const T*>(args.residual), static_cast<T*>(args.y), args.slope, args.clip_low, args.clip_high);
}

template <typename T, int R, int kStride>
void launch_tiled_with(const Depthwise& d, const Tile& t, const ForwardArgs& args, dim3 grid, dim3 block,
                       size_t shared, cudaStream_t stream) {
  switch (args.act) {  // the activations tiled_applies admits
    case Act::Relu: return launch_tiled_act<T, R, kStride, Act::Relu>(d, t, args, grid, block, shared, stream);
    case Act::Gelu: return launch_tiled_act<T, R, kStride, Act::Gelu>(d, t, args, grid, block, shared, stream);
    case Act::Silu: return launch_tiled_act<T, R, kStride, Act::Silu>(d, t, args, grid, block, shared, stream);
    case Act::LeakyRelu:
      return launch_tiled_act<T, R, kStride, Act::LeakyRelu>(d, t, args, grid, block, shared, stream);
    case Act::None: return launch_tiled_act<T, R, kStride, Act::None>(d, t, args, grid, block, shared, stream);
    default: throw std::logic_error(std::string("depthwise_nhwc_tiled: no instantiation for act ") + act_name(args.act));
  }
}

template <typename T>
void launch_tiled(const Depthwise& d, const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  const Tile t = choose_tile(s, sizeof(T));
  const int64_t tiles = (s.p + t.rows - 1) / t.rows * t.tiles_q;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((s.c + t.channels - 1) / t.channels),
                  static_cast<unsigned>(s.n));
  // thread groups: the most, up to kThreads threads, that divide the tile's tasks evenly (a tile of 48 channels
  // takes 8 groups of 24 threads for 16 tasks: 10 groups would leave 4 of them a round with nothing to do)
  const int band = task_rows(static_cast<int>(s.r));
  const int pairs = t.channels / 2, tasks = (t.rows + band - 1) / band * (t.cols / kStrip);
  int groups = std::max(1, std::min(tasks, kThreads / pairs));
  while (tasks % groups != 0) --groups;
  const dim3 block(pairs, groups);
  const size_t shared = static_cast<size_t>(tile_shared_bytes(t, sizeof(T), s.r * s.s));
  if (s.r == 3) {
    if (s.stride_h == 1) launch_tiled_with<T, 3, 1>(d, t, args, grid, block, shared, stream);
    else launch_tiled_with<T, 3, 2>(d, t, args, grid, block, shared, stream);
  } else {
    if (s.stride_h == 1) launch_tiled_with<T, 5, 1>(d, t, args, grid, block, shared, stream);
    else launch_tiled_with<T, 5, 2>(d, t, args, grid, block, shared, stream);
  }
}

template <typename T>
void launch_vec8(const Depthwise& d, const ForwardArgs& args, dim3 grid, dim3 block, size_t shared, int64_t pixels,
                 cudaStream_t stream) {
  depthwise_nhwc_vec8<T><<<grid, block, shared, stream>>>(
      d, static_cast<const T*>(args.x), static_cast<const T*>(args.w), static_cast<const T*>(args.bias),
      static_cast<const T*>(args.residual), static_cast<T*>(args.y), args.act, args.slope, args.clip_low,
      args.clip_high, pixels);
}

}  // namespace

std::string depthwise_unsupported_reason(const Shape& s, bool backward) {
  if (backward) return "forward only (backward runs on cudnn_graph, cudnn or im2col_gemm)";
  if (s.groups != s.c || s.k != s.c) {
    return "depthwise convolutions only: groups == C == K (one filter per channel), got C=" + std::to_string(s.c) +
           ", K=" + std::to_string(s.k) + ", groups=" + std::to_string(s.groups);
  }
  return "";
}

void depthwise_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  const Depthwise d{s.c, s.h, s.w, s.p, s.q, static_cast<int>(s.r), static_cast<int>(s.s),
                    static_cast<int>(s.stride_h), static_cast<int>(s.stride_w), static_cast<int>(s.pad_top),
                    static_cast<int>(s.pad_left), static_cast<int>(s.dilation_h), static_cast<int>(s.dilation_w),
                    s.layout == Layout::NHWC};
  const bool vector = d.nhwc && s.dtype != DType::Float32 && s.c % kVector == 0 && aligned16(args.x) &&
                      aligned16(args.y) && (args.bias == nullptr || aligned16(args.bias)) &&
                      (args.residual == nullptr || aligned16(args.residual));
  const bool tiled = d.nhwc && s.dtype != DType::Float32 && s.c % kVector == 0 && tiled_applies(s, args.act) &&
                     aligned16(args.x) && aligned(args.y, 4) && (args.bias == nullptr || aligned(args.bias, 4)) &&
                     (args.residual == nullptr || aligned(args.residual, 4));
  if (tiled) {
    if (s.dtype == DType::Float16) {
      launch_tiled<__half>(d, args, stream);
    } else {
      launch_tiled<__nv_bfloat16>(d, args, stream);
    }
    GE2_CHECK_LAUNCH("depthwise_nhwc_tiled");
    return;
  }
  // channel vectors per block: a warp's worth, fewer when the filters of that many would not fit 48 KB of shared memory
  const int64_t fitting = kSharedBytes / (int64_t(sizeof(float)) * s.r * s.s * kVector);
  const int vectors = static_cast<int>(std::min<int64_t>({s.c / kVector, 32, fitting}));
  if (vector && vectors > 0) {
    const dim3 block(vectors, kThreads / vectors);
    const int64_t pixels = s.n * s.p * s.q;
    const unsigned channel_blocks = static_cast<unsigned>((s.c + vectors * kVector - 1) / (vectors * kVector));
    const unsigned pixel_blocks = static_cast<unsigned>(
        std::min<int64_t>((pixels + block.y - 1) / block.y, std::max<int64_t>(1, 132 * 16 / channel_blocks)));
    const size_t shared = sizeof(float) * s.r * s.s * vectors * kVector;
    const dim3 grid(channel_blocks, pixel_blocks);
    if (s.dtype == DType::Float16) {
      launch_vec8<__half>(d, args, grid, block, shared, pixels, stream);
    } else {
      launch_vec8<__nv_bfloat16>(d, args, grid, block, shared, pixels, stream);
    }
    GE2_CHECK_LAUNCH("depthwise_nhwc_vec8");
    return;
  }
  const int64_t total = s.n * s.k * s.p * s.q;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 32));
  GE2_DISPATCH_FLOATING(s.dtype, "dtype", {
    depthwise_forward<<<blocks, kThreads, 0, stream>>>(
        d, static_cast<const scalar_t*>(args.x), static_cast<const scalar_t*>(args.w),
        static_cast<const scalar_t*>(args.bias), static_cast<const scalar_t*>(args.residual),
        static_cast<scalar_t*>(args.y), args.act, args.slope, args.clip_low, args.clip_high, total);
  });
  GE2_CHECK_LAUNCH("depthwise_forward");
}

}  // namespace ge2::conv2d
