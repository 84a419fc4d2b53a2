// The kernels that map a functor (functors.cuh) over elements, shared by forward (kernels/*.cu) and backward
// (backward.cu). Numbered simplest-first; each is a registry candidate:
//   1. map_scalar:  one element per thread, grid-stride, any alignment (the unary "strided" candidate)
//   2. map_strided: general broadcast, output index -> coordinates -> operand offsets over up to 8 dims
//   3. map_rowcol:  [rows, cols] output, every operand full / row / column / scalar, 16-byte vectors along cols
//   4. map_vec16:   same-shape contiguous operands, 16-byte vectors, kUnroll vectors per thread, one pass
// All are bandwidth-bound: the aim is enough bytes in flight (loads of every unrolled vector issued before any
// math) and 16-byte transactions.
#pragma once
#include <algorithm>

#include "api.hpp"
#include "functors.cuh"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::elementwise {

constexpr int kThreads = 256;
constexpr int kSmCount = 132;  // H100; only sizes grid-stride launches, any GPU runs them correctly

template <typename T, int N>
struct Inputs {
  const T* p[N];
};
template <typename T, int N>
struct Outputs {
  T* p[N];
};

// An operand of a [rows, cols] output: element (r, c) is at p[r * row_stride + c * col_stride], col_stride 0 or 1.
template <typename T, int N>
struct Operands2d {
  const T* p[N];
  int64_t row_stride[N];
  int64_t col_stride[N];
};

// An operand of a collapsed broadcast (api.hpp Broadcast): strides per output dim, 0 where broadcast.
template <typename T, int N>
struct StridedOperands {
  const T* p[N];
  int64_t stride[N][kMaxDims];
};

struct OutShape {
  int ndim;
  int64_t extent[kMaxDims];
};

// ---- 1. map_scalar ----------------------------------------------------------------------------------------------
template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    map_scalar_kernel(Inputs<T, F::kIn> in, Outputs<T, F::kOut> out, int64_t numel, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; index < numel; index += step) {
    float values[F::kIn], results[F::kOut];
#pragma unroll
    for (int i = 0; i < F::kIn; ++i) values[i] = to_float(in.p[i][index]);
    f(values, results);
#pragma unroll
    for (int o = 0; o < F::kOut; ++o) out.p[o][index] = from_float<T>(results[o]);
  }
}

// ---- 2. map_strided ---------------------------------------------------------------------------------------------
template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    map_strided_kernel(StridedOperands<T, F::kIn> in, T* __restrict__ out, OutShape shape, int64_t numel, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; index < numel; index += step) {
    int64_t offset[F::kIn] = {};
    int64_t rest = index;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d < shape.ndim) {
        const int64_t coordinate = rest % shape.extent[d];
        rest /= shape.extent[d];
#pragma unroll
        for (int i = 0; i < F::kIn; ++i) offset[i] += coordinate * in.stride[i][d];
      }
    }
    float values[F::kIn], result[1];
#pragma unroll
    for (int i = 0; i < F::kIn; ++i) values[i] = to_float(in.p[i][offset[i]]);
    f(values, result);
    out[index] = from_float<T>(result[0]);
  }
}

// ---- 3. map_rowcol ----------------------------------------------------------------------------------------------
// V consecutive elements of row `row` from column `col`: a vector load along a row, or one value repeated for an
// operand broadcast along the row. V > 1 needs V | cols and 16-byte aligned pointers, so a vector never crosses
// a row (map_rowcol, and colsum in backward.cu).
template <typename T, int V, int N>
__device__ __forceinline__ Pack<T, V> load_operand(const Operands2d<T, N>& in, int i, int64_t row, int64_t col) {
  const T* base = in.p[i] + row * in.row_stride[i];
  if (in.col_stride[i] != 0) return load_pack<T, V>(base + col);
  Pack<T, V> pack;
  const T value = *base;
#pragma unroll
  for (int e = 0; e < V; ++e) pack.values[e] = value;
  return pack;
}

template <typename T, typename F, int kUnroll>
__global__ void __launch_bounds__(kThreads)
    map_rowcol_kernel(Operands2d<T, F::kIn> in, T* __restrict__ out, int64_t rows, int64_t cols, F f) {
  constexpr int P = kPackSize<T>;
  const int64_t packs_per_row = cols / P;
  const int64_t packs = rows * packs_per_row;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  Pack<T, P> loaded[kUnroll][F::kIn];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t pack = first + u * kThreads;
    if (pack < packs) {
      const int64_t row = pack / packs_per_row, col = (pack - row * packs_per_row) * P;
#pragma unroll
      for (int i = 0; i < F::kIn; ++i) loaded[u][i] = load_operand<T, P>(in, i, row, col);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t pack = first + u * kThreads;
    if (pack < packs) {
      Pack<T, P> result;
#pragma unroll
      for (int e = 0; e < P; ++e) {
        float values[F::kIn], value[1];
#pragma unroll
        for (int i = 0; i < F::kIn; ++i) values[i] = to_float(loaded[u][i].values[e]);
        f(values, value);
        result.values[e] = from_float<T>(value[0]);
      }
      store_pack<T, P>(out + pack * P, result);
    }
  }
}

// ---- 4. map_vec16 -----------------------------------------------------------------------------------------------
template <typename T, typename F, int kUnroll>
__global__ void __launch_bounds__(kThreads)
    map_vec16_kernel(Inputs<T, F::kIn> in, Outputs<T, F::kOut> out, int64_t numel, F f) {
  constexpr int P = kPackSize<T>;
  const int64_t packs = numel / P;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  Pack<T, P> loaded[kUnroll][F::kIn];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t pack = first + u * kThreads;
    if (pack < packs) {
#pragma unroll
      for (int i = 0; i < F::kIn; ++i) loaded[u][i] = load_pack<T, P>(in.p[i] + pack * P);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t pack = first + u * kThreads;
    if (pack < packs) {
      Pack<T, P> results[F::kOut];
#pragma unroll
      for (int e = 0; e < P; ++e) {
        float values[F::kIn], outputs[F::kOut];
#pragma unroll
        for (int i = 0; i < F::kIn; ++i) values[i] = to_float(loaded[u][i].values[e]);
        f(values, outputs);
#pragma unroll
        for (int o = 0; o < F::kOut; ++o) results[o].values[e] = from_float<T>(outputs[o]);
      }
#pragma unroll
      for (int o = 0; o < F::kOut; ++o) store_pack<T, P>(out.p[o] + pack * P, results[o]);
    }
  }
  // The last block also takes the tail that does not fill a vector (fewer than P elements).
  if (blockIdx.x == gridDim.x - 1) {
    const int64_t index = packs * P + threadIdx.x;
    if (index < numel) {
      float values[F::kIn], outputs[F::kOut];
#pragma unroll
      for (int i = 0; i < F::kIn; ++i) values[i] = to_float(in.p[i][index]);
      f(values, outputs);
#pragma unroll
      for (int o = 0; o < F::kOut; ++o) out.p[o][index] = from_float<T>(outputs[o]);
    }
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------
constexpr int kUnroll = 4;

inline int blocks_for(int64_t units, int64_t per_block) {
  return static_cast<int>(std::max<int64_t>(1, (units + per_block - 1) / per_block));
}

inline int grid_stride_blocks(int64_t numel) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(1, (numel + kThreads - 1) / kThreads), kSmCount * 16));
}

template <typename T, typename F>
void launch_map_scalar(Inputs<T, F::kIn> in, Outputs<T, F::kOut> out, int64_t numel, F f, cudaStream_t stream) {
  if (numel == 0) return;
  map_scalar_kernel<T, F><<<grid_stride_blocks(numel), kThreads, 0, stream>>>(in, out, numel, f);
  GE2_CHECK_LAUNCH("elementwise map_scalar");
}

template <typename T, typename F>
void launch_map_vec16(Inputs<T, F::kIn> in, Outputs<T, F::kOut> out, int64_t numel, F f, cudaStream_t stream) {
  if (numel == 0) return;
  const int64_t packs = numel / kPackSize<T>;
  map_vec16_kernel<T, F, kUnroll><<<blocks_for(packs, kThreads * kUnroll), kThreads, 0, stream>>>(in, out, numel, f);
  GE2_CHECK_LAUNCH("elementwise map_vec16");
}

template <typename T, typename F>
void launch_map_rowcol(Operands2d<T, F::kIn> in, T* out, int64_t rows, int64_t cols, F f, cudaStream_t stream) {
  if (rows * cols == 0) return;
  const int64_t packs = rows * (cols / kPackSize<T>);
  map_rowcol_kernel<T, F, kUnroll><<<blocks_for(packs, kThreads * kUnroll), kThreads, 0, stream>>>(in, out, rows,
                                                                                                    cols, f);
  GE2_CHECK_LAUNCH("elementwise map_rowcol");
}

template <typename T, typename F>
void launch_map_strided(StridedOperands<T, F::kIn> in, T* out, const Broadcast& problem, F f, cudaStream_t stream) {
  if (problem.numel == 0) return;
  OutShape shape{problem.ndim, {}};
  for (int d = 0; d < problem.ndim; ++d) shape.extent[d] = problem.shape[d];
  map_strided_kernel<T, F><<<grid_stride_blocks(problem.numel), kThreads, 0, stream>>>(in, out, shape,
                                                                                        problem.numel, f);
  GE2_CHECK_LAUNCH("elementwise map_strided");
}

// ---- operand descriptions from a Broadcast ----------------------------------------------------------------------
// The output's own (contiguous) strides, for dy in backward.
inline void contiguous_strides(const Broadcast& problem, int64_t* stride) {
  int64_t running = 1;
  for (int d = problem.ndim - 1; d >= 0; --d) {
    stride[d] = running;
    running *= problem.shape[d];
  }
}

// Row and column strides of an operand of a 2-d Broadcast (problem.is_2d()).
inline void strides_2d(const Broadcast& problem, const int64_t* stride, int64_t* row_stride, int64_t* col_stride) {
  *row_stride = problem.ndim == 2 ? stride[0] : 0;
  *col_stride = problem.ndim >= 1 ? stride[problem.ndim - 1] : 0;
}

}  // namespace ge2::elementwise
