// Row-wise normalization kernels shared by layernorm (kCentered = true) and rmsnorm (kCentered = false); the host
// side and the kernel list are in api.hpp. Each module instantiates forward, backward and backward_workspace_bytes
// for its variant in launcher.cu and backward.cu.
//
// Numerics: float32 statistics from the row held in registers, two passes over the registers (mean, then the mean
// of squared deviations), so a large common offset (x ~ 1e3 + noise) loses nothing to cancellation.
// Memory: x and dy are read exactly once with streaming (evict-first) loads and y/dx written with streaming
// stores, so gamma/beta, which every row reads again, stay in L1.
#pragma once
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "dtype.hpp"
#include "reduction.hpp"
#include "api.hpp"
#include "status.hpp"
#include "streaming_access.hpp"
#include "vector_access.hpp"

namespace ge2::row_norm {

// ================================================================================================================
// Element access: packs of kVec elements (one 16-byte access, or a scalar when kVec == 1); the streaming loads and
// stores of x, dy, y and dx are _common/streaming_access.hpp's
// ================================================================================================================
// Scalar 16-bit loads go through the unsigned short overloads of __ldg (asm volatile) and are bit-cast:
// cuda_fp16.hpp / cuda_bf16.hpp implement __ldcs/__ldg for __half and __nv_bfloat16 as non-volatile asm, which the
// compiler treats as a side-effect-free value and may speculate past its guard. It did: the gamma/beta loads of
// pack 0 (column = lane, the same for every row) were hoisted out of the row loop and above `c < cols`, reading
// gamma[lane] for every lane (out of bounds for cols < 32). Volatile asm is never moved out of its branch.
template <typename T>
__device__ __forceinline__ T load_scalar_cached(const T* pointer) {
  if constexpr (sizeof(T) == 2) {
    const unsigned short raw = __ldg(reinterpret_cast<const unsigned short*>(pointer));
    T value;
    memcpy(&value, &raw, sizeof(raw));
    return value;
  } else {
    return __ldg(pointer);  // float: asm volatile already
  }
}

// gamma and beta: read again by every row, so read through the read-only path and kept in L1.
template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_cached(const T* pointer) {
  Pack<T, kVec> pack;
  if constexpr (kVec == 1) {
    pack.values[0] = load_scalar_cached(pointer);
  } else {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(pointer));
    memcpy(&pack, &raw, sizeof(raw));
  }
  return pack;
}

// One thread's share of a row, kept in the storage type (half the registers of float32 for 16-bit types) and
// converted on use. Pack k holds columns column(k, lane) ... + kVec - 1: consecutive threads take consecutive
// packs, so every access of the group is coalesced.
template <typename T, int kVecSize, int kItems, int kGroupThreads>
struct RowSlice {
  static_assert(kItems % kVecSize == 0, "a thread holds whole packs");
  static constexpr int kVec = kVecSize;
  static constexpr int kPacks = kItems / kVec;
  Pack<T, kVec> packs[kPacks];

  __device__ __forceinline__ static int column(int k, int lane) { return (k * kGroupThreads + lane) * kVec; }

  // Columns past the end, and every column of an inactive row, read as zero.
  __device__ __forceinline__ void load(const T* row, int lane, int cols, bool active) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int c = column(k, lane);
      if (active && c < cols) {
        packs[k] = load_streaming<T, kVec>(row + c);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) packs[k].values[j] = from_float<T>(0.0f);
      }
    }
  }

  __device__ __forceinline__ float operator()(int k, int j) const { return to_float(packs[k].values[j]); }
};

// ================================================================================================================
// Reductions over a group of kGroupThreads consecutive threads (a warp, or 128..1024 threads)
// ================================================================================================================
// Sums kValues values per thread over the group; every thread of the group gets the sums. The order is fixed, so
// the result is bitwise identical in every thread and on every run. Groups wider than a warp go through `scratch`
// ((blockDim.x / 32) * kValues floats) and synchronize the block: every thread of the block must call it.
template <int kGroupThreads, int kValues>
__device__ __forceinline__ void group_sum(float (&values)[kValues], float* scratch) {
#pragma unroll
  for (int i = 0; i < kValues; ++i) values[i] = warp_reduce(values[i], SumOp{});
  if constexpr (kGroupThreads > 32) {
    constexpr int kWarps = kGroupThreads / 32;
    const int warp = static_cast<int>(threadIdx.x / 32);
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int i = 0; i < kValues; ++i) scratch[warp * kValues + i] = values[i];
    }
    __syncthreads();
    const int first_warp = warp / kWarps * kWarps;
#pragma unroll
    for (int i = 0; i < kValues; ++i) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += scratch[(first_warp + w) * kValues + i];
      values[i] = total;
    }
    __syncthreads();  // the next call may overwrite scratch
  }
}

// mean (0 when not centered) and rstd of a row held in registers. Zero-filled columns past the end add nothing to
// the sum and are skipped in the squared deviations.
template <bool kCentered, int kGroupThreads, typename Slice>
__device__ __forceinline__ void row_statistics(const Slice& x, int lane, int cols, float eps, float* scratch,
                                               float& mean, float& rstd) {
  mean = 0.0f;
  if constexpr (kCentered) {
    float sum[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < Slice::kPacks; ++k) {
#pragma unroll
      for (int j = 0; j < Slice::kVec; ++j) sum[0] += x(k, j);
    }
    group_sum<kGroupThreads>(sum, scratch);
    mean = sum[0] / static_cast<float>(cols);
  }
  float squares[1] = {0.0f};
#pragma unroll
  for (int k = 0; k < Slice::kPacks; ++k) {
    if (Slice::column(k, lane) < cols) {
#pragma unroll
      for (int j = 0; j < Slice::kVec; ++j) {
        const float d = x(k, j) - mean;
        squares[0] += d * d;
      }
    }
  }
  group_sum<kGroupThreads>(squares, scratch);
  rstd = rsqrtf(squares[0] / static_cast<float>(cols) + eps);
}

// The same statistics for the multipass kernels, re-reading the row from memory (L2) for each pass.
template <bool kCentered, typename T>
__device__ __forceinline__ void multipass_statistics(const T* row, int64_t cols, float eps, float* scratch,
                                                    float& mean, float& rstd) {
  mean = 0.0f;
  if constexpr (kCentered) {
    float sum[1] = {0.0f};
    for (int64_t c = threadIdx.x; c < cols; c += kMultipassThreads) sum[0] += to_float(row[c]);
    group_sum<kMultipassThreads>(sum, scratch);
    mean = sum[0] / static_cast<float>(cols);
  }
  float squares[1] = {0.0f};
  for (int64_t c = threadIdx.x; c < cols; c += kMultipassThreads) {
    const float d = to_float(row[c]) - mean;
    squares[0] += d * d;
  }
  group_sum<kMultipassThreads>(squares, scratch);
  rstd = rsqrtf(squares[0] / static_cast<float>(cols) + eps);
}

// ================================================================================================================
// Forward kernels
// ================================================================================================================
// warp_per_row (kGroupThreads = 32) and block_per_row (128..1024): each group of threads owns one row at a time,
// holds it in registers, and writes y (and the statistics) from there: x is read once.
template <typename T, bool kCentered, int kVec, int kItems, int kGroupThreads, int kGroups>
__global__ void __launch_bounds__(kGroupThreads * kGroups) forward_registers(Forward args) {
  using Slice = RowSlice<T, kVec, kItems, kGroupThreads>;
  __shared__ float scratch[kGroupThreads * kGroups / 32];
  const int group = static_cast<int>(threadIdx.x) / kGroupThreads;
  const int lane = static_cast<int>(threadIdx.x) % kGroupThreads;
  const int cols = static_cast<int>(args.cols);
  const T* x = static_cast<const T*>(args.x);
  const T* gamma = static_cast<const T*>(args.gamma);
  const T* beta = static_cast<const T*>(args.beta);
  T* y = static_cast<T*>(args.y);

  // The loop bound is the same for every thread of the block, so the group reductions may synchronize it.
  for (int64_t first = int64_t{blockIdx.x} * kGroups; first < args.rows; first += int64_t{gridDim.x} * kGroups) {
    const int64_t row = first + group;
    const bool active = row < args.rows;
    const int64_t offset = (active ? row : 0) * args.cols;
    Slice slice;
    slice.load(x + offset, lane, cols, active);
    float mean, rstd;
    row_statistics<kCentered, kGroupThreads>(slice, lane, cols, args.eps, scratch, mean, rstd);
    if (!active) continue;
#pragma unroll
    for (int k = 0; k < Slice::kPacks; ++k) {
      const int c = Slice::column(k, lane);
      if (c >= cols) continue;
      const Pack<T, kVec> g = load_cached<T, kVec>(gamma + c);
      Pack<T, kVec> out;
      if constexpr (kCentered) {
        const Pack<T, kVec> b = load_cached<T, kVec>(beta + c);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          out.values[j] = from_float<T>((slice(k, j) - mean) * rstd * to_float(g.values[j]) + to_float(b.values[j]));
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) out.values[j] = from_float<T>(slice(k, j) * rstd * to_float(g.values[j]));
      }
      store_streaming<T, kVec>(y + offset + c, out);
    }
    if (lane == 0) {
      if (kCentered && args.mean != nullptr) args.mean[row] = mean;
      if (args.rstd != nullptr) args.rstd[row] = rstd;
    }
  }
}

// multipass: one block per row, three passes over the row (sum, squared deviations, output), scalar accesses:
// any length, any alignment.
template <typename T, bool kCentered>
__global__ void __launch_bounds__(kMultipassThreads) forward_multipass(Forward args) {
  __shared__ float scratch[kMultipassThreads / 32];
  const T* gamma = static_cast<const T*>(args.gamma);
  const T* beta = static_cast<const T*>(args.beta);
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(args.x) + row * args.cols;
    T* y = static_cast<T*>(args.y) + row * args.cols;
    float mean, rstd;
    multipass_statistics<kCentered>(x, args.cols, args.eps, scratch, mean, rstd);
    for (int64_t c = threadIdx.x; c < args.cols; c += kMultipassThreads) {
      const float normalized = (to_float(x[c]) - mean) * rstd * to_float(gamma[c]);
      y[c] = from_float<T>(kCentered ? normalized + to_float(beta[c]) : normalized);
    }
    if (threadIdx.x == 0) {
      if (kCentered && args.mean != nullptr) args.mean[row] = mean;
      if (args.rstd != nullptr) args.rstd[row] = rstd;
    }
  }
}

// ================================================================================================================
// Backward kernels
// ================================================================================================================
// Writes one channel of a block's column sums (one register array per thread, laid out as its row slice) to
// `part`. Several groups per block add up in group order through `stage` (kGroupThreads * kItems floats);
// every thread of the block must call it.
template <typename Slice, int kGroups>
__device__ __forceinline__ void write_part(const float (&sums)[Slice::kPacks * Slice::kVec], float* part,
                                           float* stage, int group, int lane, int cols) {
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int k = 0; k < Slice::kPacks; ++k) {
      const int c = Slice::column(k, lane);
      if (c >= cols) continue;
#pragma unroll
      for (int j = 0; j < Slice::kVec; ++j) part[c + j] = sums[k * Slice::kVec + j];
    }
  } else {
    for (int turn = 0; turn < kGroups; ++turn) {
      if (group == turn) {
#pragma unroll
        for (int k = 0; k < Slice::kPacks; ++k) {
          const int c = Slice::column(k, lane);
          if (c >= cols) continue;
#pragma unroll
          for (int j = 0; j < Slice::kVec; ++j) {
            const float value = sums[k * Slice::kVec + j];
            stage[c + j] = turn == 0 ? value : stage[c + j] + value;
          }
        }
      }
      __syncthreads();
    }
    for (int c = static_cast<int>(threadIdx.x); c < cols; c += static_cast<int>(blockDim.x)) part[c] = stage[c];
    __syncthreads();  // stage is reused by the next channel
  }
}

// With xhat = (x - mean) * rstd and g = gamma * dy:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))        (not centered: no mean(g) term)
//   dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy.
// A persistent grid: block b owns row groups b, b + gridDim.x, ..., keeps its column sums in registers and writes
// them once to part b of the workspace (float32 [channels][parts][cols]); sum_parts adds the parts in order.
template <typename T, bool kCentered, int kVec, int kItems, int kGroupThreads, int kGroups>
__global__ void __launch_bounds__(kGroupThreads * kGroups) backward_registers(Backward args, int64_t parts) {
  using Slice = RowSlice<T, kVec, kItems, kGroupThreads>;
  constexpr int kThreads = kGroupThreads * kGroups;
  constexpr int kChannels = kCentered ? 2 : 1;
  __shared__ float scratch[kThreads / 32 * kChannels];
  const int group = static_cast<int>(threadIdx.x) / kGroupThreads;
  const int lane = static_cast<int>(threadIdx.x) % kGroupThreads;
  const int cols = static_cast<int>(args.cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const T* dy_base = static_cast<const T*>(args.dy);
  const T* x_base = static_cast<const T*>(args.x);
  const T* gamma = static_cast<const T*>(args.gamma);
  T* dx_base = static_cast<T*>(args.dx);

  float dgamma[kItems];
  float dbeta[kCentered ? kItems : 1];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    dgamma[i] = 0.0f;
    if constexpr (kCentered) dbeta[i] = 0.0f;
  }

  for (int64_t first = int64_t{blockIdx.x} * kGroups; first < args.rows; first += int64_t{gridDim.x} * kGroups) {
    const int64_t row = first + group;
    const bool active = row < args.rows;
    const int64_t offset = (active ? row : 0) * args.cols;
    Slice x, dy;
    x.load(x_base + offset, lane, cols, active);
    dy.load(dy_base + offset, lane, cols, active);
    float mean = 0.0f, rstd = 0.0f;
    if (args.rstd != nullptr) {  // the same for the whole block: the branch never splits a reduction
      if (active) {
        rstd = args.rstd[row];
        if constexpr (kCentered) mean = args.mean[row];
      }
    } else {
      row_statistics<kCentered, kGroupThreads>(x, lane, cols, args.eps, scratch, mean, rstd);
    }

    // One pass over the registers for the row sums (sums[0] = sum(g * xhat), sums[1] = sum(g)) and this block's
    // column sums. Zero-filled columns (past the end, or every column of an inactive row) add exact zeros.
    float sums[kChannels];
#pragma unroll
    for (int i = 0; i < kChannels; ++i) sums[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < Slice::kPacks; ++k) {
      const int c = Slice::column(k, lane);
      if (c >= cols) continue;
      const Pack<T, kVec> gm = load_cached<T, kVec>(gamma + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = dy(k, j);
        const float xhat = (x(k, j) - mean) * rstd;
        const float g = to_float(gm.values[j]) * d;
        sums[0] += g * xhat;
        dgamma[k * kVec + j] += d * xhat;
        if constexpr (kCentered) {
          sums[1] += g;
          dbeta[k * kVec + j] += d;
        }
      }
    }
    group_sum<kGroupThreads>(sums, scratch);
    if (!active) continue;
    const float mean_gx = sums[0] * inv_cols;
    const float mean_g = kCentered ? sums[kChannels - 1] * inv_cols : 0.0f;
#pragma unroll
    for (int k = 0; k < Slice::kPacks; ++k) {
      const int c = Slice::column(k, lane);
      if (c >= cols) continue;
      const Pack<T, kVec> gm = load_cached<T, kVec>(gamma + c);
      Pack<T, kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xhat = (x(k, j) - mean) * rstd;
        const float g = to_float(gm.values[j]) * dy(k, j);
        out.values[j] = from_float<T>(rstd * (g - mean_g - xhat * mean_gx));
      }
      store_streaming<T, kVec>(dx_base + offset + c, out);
    }
  }

  // Part blockIdx.x of each channel.
  __shared__ float stage[kGroups > 1 ? kGroupThreads * kItems : 1];
  write_part<Slice, kGroups>(dgamma, args.workspace + int64_t{blockIdx.x} * args.cols, stage, group, lane, cols);
  if constexpr (kCentered) {
    write_part<Slice, kGroups>(dbeta, args.workspace + (parts + blockIdx.x) * args.cols, stage, group, lane, cols);
  }
}

// multipass: one block per row re-reading x and dy for each pass; the block's column sums accumulate in its own
// part of the workspace (each column always by the same thread, so no two threads ever touch one address).
template <typename T, bool kCentered>
__global__ void __launch_bounds__(kMultipassThreads) backward_multipass(Backward args, int64_t parts) {
  constexpr int kChannels = kCentered ? 2 : 1;
  __shared__ float scratch[kMultipassThreads / 32 * kChannels];
  const T* gamma = static_cast<const T*>(args.gamma);
  const int64_t cols = args.cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  float* part_gamma = args.workspace + int64_t{blockIdx.x} * cols;
  float* part_beta = args.workspace + (parts + blockIdx.x) * cols;
  bool first_row = true;  // gridDim.x <= rows: every block has one
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(args.x) + row * cols;
    const T* dy = static_cast<const T*>(args.dy) + row * cols;
    T* dx = static_cast<T*>(args.dx) + row * cols;
    float mean = 0.0f, rstd;
    if (args.rstd != nullptr) {
      rstd = args.rstd[row];
      if constexpr (kCentered) mean = args.mean[row];
    } else {
      multipass_statistics<kCentered>(x, cols, args.eps, scratch, mean, rstd);
    }
    float sums[kChannels];
#pragma unroll
    for (int i = 0; i < kChannels; ++i) sums[i] = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kMultipassThreads) {
      const float g = to_float(gamma[c]) * to_float(dy[c]);
      sums[0] += g * ((to_float(x[c]) - mean) * rstd);
      if constexpr (kCentered) sums[1] += g;
    }
    group_sum<kMultipassThreads>(sums, scratch);
    const float mean_gx = sums[0] * inv_cols;
    const float mean_g = kCentered ? sums[kChannels - 1] * inv_cols : 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kMultipassThreads) {
      const float xhat = (to_float(x[c]) - mean) * rstd;
      const float d = to_float(dy[c]);
      dx[c] = from_float<T>(rstd * (to_float(gamma[c]) * d - mean_g - xhat * mean_gx));
      part_gamma[c] = first_row ? d * xhat : part_gamma[c] + d * xhat;
      if constexpr (kCentered) part_beta[c] = first_row ? d : part_beta[c] + d;
    }
    first_row = false;
  }
}

// dgamma[c] (blockIdx.y == 0) or dbeta[c] (1) = the sum over parts p of workspace[blockIdx.y][p][c], in a fixed
// order: 16 slices of the parts per column, each added in order (in batches of 8 independent loads, to keep L2
// busy), then the 16 slice sums in order.
constexpr int kSumColumns = 32;
constexpr int kSumSlices = 16;

template <typename T>
__global__ void __launch_bounds__(kSumColumns * kSumSlices)
    sum_parts(const float* workspace, int64_t parts, int64_t cols, T* dgamma, T* dbeta) {
  __shared__ float stage[kSumSlices][kSumColumns + 1];
  const int lane = static_cast<int>(threadIdx.x) % kSumColumns;
  const int slice = static_cast<int>(threadIdx.x) / kSumColumns;
  const int64_t col = int64_t{blockIdx.x} * kSumColumns + lane;
  const float* channel = workspace + int64_t{blockIdx.y} * parts * cols;
  float total = 0.0f;
  if (col < cols) {
    constexpr int kBatch = 8;
    int64_t p = slice;
    for (; p + (kBatch - 1) * kSumSlices < parts; p += kBatch * kSumSlices) {
      float values[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) values[i] = channel[(p + i * kSumSlices) * cols + col];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) total += values[i];
    }
    for (; p < parts; p += kSumSlices) total += channel[p * cols + col];
  }
  stage[slice][lane] = total;
  __syncthreads();
  if (slice == 0 && col < cols) {
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSumSlices; ++s) sum += stage[s][lane];
    T* out = blockIdx.y == 0 ? dgamma : dbeta;
    out[col] = from_float<T>(sum);
  }
}

// ================================================================================================================
// Host: picking the instance for a geometry, launching
// ================================================================================================================
// Grid cap for the non-persistent forward: past it, groups loop over more rows.
constexpr int64_t kMaxForwardBlocks = int64_t{1} << 20;

// The kernel instances that exist; choose_geometry (api.hpp) never asks for another. Items per thread:
//   forward   warp 32 x 4 groups: 4..32 | 128 threads: 4..32 | 256: 16, 32 | 512: 16 scalar, 32 vector | 1024: 32
//   backward  warp 32 x 4 groups: 4..32 | 128 threads: 4..32 | 256: 16 scalar, 32 vector
// with at most kMaxScalarItems items for scalar loads. Forward and backward instances come from separate families.
struct ForwardFamily {
  template <typename T, bool kCentered, int kVec, int kItems, int kGroupThreads, int kGroups>
  static const void* registers() {
    return reinterpret_cast<const void*>(&forward_registers<T, kCentered, kVec, kItems, kGroupThreads, kGroups>);
  }
  template <typename T, bool kCentered>
  static const void* multipass() {
    return reinterpret_cast<const void*>(&forward_multipass<T, kCentered>);
  }
  // Group widths (threads, groups per block) and the items per thread each is instantiated for.
  template <typename T, bool kCentered, int kVec>
  static const void* find(const Geometry& g);
};

struct BackwardFamily {
  template <typename T, bool kCentered, int kVec, int kItems, int kGroupThreads, int kGroups>
  static const void* registers() {
    return reinterpret_cast<const void*>(&backward_registers<T, kCentered, kVec, kItems, kGroupThreads, kGroups>);
  }
  template <typename T, bool kCentered>
  static const void* multipass() {
    return reinterpret_cast<const void*>(&backward_multipass<T, kCentered>);
  }
  template <typename T, bool kCentered, int kVec>
  static const void* find(const Geometry& g);
};

template <typename Family, typename T, bool kCentered, int kVec, int kGroupThreads, int kGroups, int kItems>
const void* instance() {
  if constexpr (kItems % kVec != 0 || kItems > (kVec == 1 ? kMaxScalarItems : kMaxItems)) {
    return nullptr;
  } else {
    return Family::template registers<T, kCentered, kVec, kItems, kGroupThreads, kGroups>();
  }
}

template <typename Family, typename T, bool kCentered, int kVec, int kGroupThreads, int kGroups>
const void* instance_for_items(int items) {
  switch (items) {
    case 4: return instance<Family, T, kCentered, kVec, kGroupThreads, kGroups, 4>();
    case 8: return instance<Family, T, kCentered, kVec, kGroupThreads, kGroups, 8>();
    case 16: return instance<Family, T, kCentered, kVec, kGroupThreads, kGroups, 16>();
    case 32: return instance<Family, T, kCentered, kVec, kGroupThreads, kGroups, 32>();
    default: return nullptr;
  }
}

inline bool has_width(const Geometry& g, int group_threads, int groups) {
  return g.group_threads == group_threads && g.groups == groups;
}

template <typename T, bool kCentered, int kVec>
const void* ForwardFamily::find(const Geometry& g) {
  using F = ForwardFamily;
  constexpr int kWideItems = kVec == 1 ? kMaxScalarItems : kMaxItems;  // what groups of 256+ threads hold
  if (has_width(g, 32, 4)) return instance_for_items<F, T, kCentered, kVec, 32, 4>(g.items);
  if (has_width(g, 128, 1)) return instance_for_items<F, T, kCentered, kVec, 128, 1>(g.items);
  if (has_width(g, 256, 1) && g.items == 16) return instance<F, T, kCentered, kVec, 256, 1, 16>();
  if (has_width(g, 256, 1) && g.items == 32) return instance<F, T, kCentered, kVec, 256, 1, 32>();
  if (has_width(g, 512, 1) && g.items == kWideItems) return instance<F, T, kCentered, kVec, 512, 1, kWideItems>();
  if constexpr (kVec > 1) {
    if (has_width(g, 1024, 1) && g.items == kMaxItems) return instance<F, T, kCentered, kVec, 1024, 1, kMaxItems>();
  }
  return nullptr;
}

template <typename T, bool kCentered, int kVec>
const void* BackwardFamily::find(const Geometry& g) {
  using F = BackwardFamily;
  constexpr int kWideItems = kVec == 1 ? kMaxScalarItems : kMaxItems;
  if (has_width(g, 32, 4)) return instance_for_items<F, T, kCentered, kVec, 32, 4>(g.items);
  if (has_width(g, 128, 1)) return instance_for_items<F, T, kCentered, kVec, 128, 1>(g.items);
  if (has_width(g, 256, 1) && g.items == kWideItems) return instance<F, T, kCentered, kVec, 256, 1, kWideItems>();
  return nullptr;
}

template <typename Family, typename T, bool kCentered>
const void* find_instance(const Geometry& g) {
  if (g.kernel == Kernel::Multipass) return Family::template multipass<T, kCentered>();
  return g.vec == 1 ? Family::template find<T, kCentered, 1>(g)
                    : Family::template find<T, kCentered, kPackSize<T>>(g);
}

template <typename Family, bool kCentered>
const void* kernel_for(const Geometry& g, DType dtype) {
  const void* kernel = nullptr;
  GE2_DISPATCH_FLOATING(dtype, "dtype", kernel = (find_instance<Family, scalar_t, kCentered>(g)));
  if (kernel == nullptr) {
    throw std::logic_error(std::string("row_norm: no ") + kernel_name(g.kernel) + " instance for group_threads=" +
                           std::to_string(g.group_threads) + " groups=" + std::to_string(g.groups) +
                           " items=" + std::to_string(g.items) + " vec=" + std::to_string(g.vec));
  }
  return kernel;
}

inline void check_launch(cudaError_t status, Kernel kernel, const char* direction) {
  if (status != cudaSuccess) {
    throw_cuda_error(status, GE2_OP_NAME, (std::string("launch of ") + kernel_name(kernel) + " " + direction).c_str());
  }
}

// Blocks of a persistent grid: as many as fit on the GPU at once (never more than there is work for). The
// occupancy of each kernel is asked once per device and kept.
inline int64_t persistent_blocks(const void* kernel, int threads, int64_t work) {
  int device = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static auto* cache = new std::map<std::pair<const void*, int>, int64_t>();  // never destroyed, as LtResources
  int64_t resident = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = cache->find({kernel, device});
    if (found != cache->end()) {
      resident = found->second;
    } else {
      int sms = 0, per_sm = 0;
      GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      GE2_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
      if (per_sm < 1) {
        throw std::runtime_error(std::string("ge2 op '") + GE2_OP_NAME + "': a backward kernel of " +
                                 std::to_string(threads) + " threads does not fit on an SM of this GPU");
      }
      resident = int64_t{sms} * per_sm;
      cache->emplace(std::make_pair(kernel, device), resident);
    }
  }
  return std::max<int64_t>(1, std::min(work, resident));
}

struct BackwardPlan {
  Geometry geometry;
  const void* kernel = nullptr;
  int64_t parts = 0;
  std::size_t workspace_bytes = 0;
};

template <bool kCentered>
BackwardPlan plan_backward(int64_t rows, int64_t cols, DType dtype, bool aligned, Kernel kernel) {
  BackwardPlan plan;
  plan.geometry = choose_geometry(kernel, cols, dtype, aligned, /*backward=*/true);
  plan.kernel = kernel_for<BackwardFamily, kCentered>(plan.geometry, dtype);
  const int64_t row_groups = (rows + plan.geometry.groups - 1) / plan.geometry.groups;
  plan.parts = persistent_blocks(plan.kernel, plan.geometry.threads(), row_groups);
  plan.workspace_bytes = static_cast<std::size_t>(kCentered ? 2 : 1) * plan.parts * cols * sizeof(float);
  return plan;
}

template <bool kCentered>
Kernel forward(const Forward& args, Kernel kernel, cudaStream_t stream) {
  check_problem(args.rows, args.cols, args.dtype);
  check_eps(args.eps);
  require_pointer(args.gamma, "gamma");
  if (kCentered) require_pointer(args.beta, "beta");
  if (args.rows > 0) {
    require_pointer(args.x, "x");
    require_pointer(args.y, "y");
  }
  const bool aligned =
      aligned16(args.x) && aligned16(args.y) && aligned16(args.gamma) && (!kCentered || aligned16(args.beta));
  check_kernel(kernel, args.cols, args.dtype, aligned, /*backward=*/false);
  if (args.rows == 0) return kernel;

  const Geometry geometry = choose_geometry(kernel, args.cols, args.dtype, aligned, /*backward=*/false);
  const void* function = kernel_for<ForwardFamily, kCentered>(geometry, args.dtype);
  const int64_t blocks = std::min((args.rows + geometry.groups - 1) / geometry.groups, kMaxForwardBlocks);
  Forward params = args;
  void* pointers[] = {&params};
  check_launch(cudaLaunchKernel(function, dim3(static_cast<unsigned>(blocks)), dim3(geometry.threads()), pointers, 0,
                                stream),
               kernel, "forward");
  return kernel;
}

template <bool kCentered>
std::size_t backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype, bool aligned, Kernel kernel) {
  check_problem(rows, cols, dtype);
  check_kernel(kernel, cols, dtype, aligned, /*backward=*/true);
  if (rows == 0) return 0;
  return plan_backward<kCentered>(rows, cols, dtype, aligned, kernel).workspace_bytes;
}

template <bool kCentered>
Kernel backward(const Backward& args, Kernel kernel, cudaStream_t stream) {
  check_problem(args.rows, args.cols, args.dtype);
  check_eps(args.eps);
  require_pointer(args.gamma, "gamma");
  require_pointer(args.dgamma, "dgamma");
  if (kCentered) require_pointer(args.dbeta, "dbeta");
  if (args.rows > 0) {
    require_pointer(args.dy, "dy");
    require_pointer(args.x, "x");
    require_pointer(args.dx, "dx");
  }
  if (kCentered && (args.mean == nullptr) != (args.rstd == nullptr)) {
    throw std::invalid_argument("mean, rstd: pass both saved statistics or neither (then they are recomputed)");
  }
  const bool aligned = aligned16(args.dy) && aligned16(args.x) && aligned16(args.gamma) && aligned16(args.dx);
  check_kernel(kernel, args.cols, args.dtype, aligned, /*backward=*/true);
  const std::size_t gradient_bytes = static_cast<std::size_t>(args.cols) * dtype_size(args.dtype);
  if (args.rows == 0) {  // no rows: dgamma and dbeta are sums of nothing
    GE2_CUDA_CHECK(cudaMemsetAsync(args.dgamma, 0, gradient_bytes, stream));
    if (kCentered) GE2_CUDA_CHECK(cudaMemsetAsync(args.dbeta, 0, gradient_bytes, stream));
    return kernel;
  }

  const BackwardPlan plan = plan_backward<kCentered>(args.rows, args.cols, args.dtype, aligned, kernel);
  if (args.workspace == nullptr || args.workspace_bytes < plan.workspace_bytes) {
    throw std::invalid_argument("workspace: this problem needs " + std::to_string(plan.workspace_bytes) +
                                " bytes (backward_workspace_bytes), got " + std::to_string(args.workspace_bytes) +
                                (args.workspace == nullptr ? " at a null pointer" : ""));
  }
  Backward params = args;
  int64_t parts = plan.parts;
  void* pointers[] = {&params, &parts};
  check_launch(cudaLaunchKernel(plan.kernel, dim3(static_cast<unsigned>(plan.parts)),
                                dim3(plan.geometry.threads()), pointers, 0, stream),
               kernel, "backward");
  const dim3 grid(static_cast<unsigned>((args.cols + kSumColumns - 1) / kSumColumns), kCentered ? 2 : 1);
  GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                        sum_parts<scalar_t><<<grid, kSumColumns * kSumSlices, 0, stream>>>(
                            args.workspace, plan.parts, args.cols, static_cast<scalar_t*>(args.dgamma),
                            static_cast<scalar_t*>(args.dbeta)));
  GE2_CHECK_LAUNCH("sum_parts");
  return kernel;
}

}  // namespace ge2::row_norm
