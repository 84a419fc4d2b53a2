// reduce backward.
//   sum, mean: dx = dy (broadcast over the reduced axes) * scale, scale = 1 or 1 / count. For Rows and Columns
//     ([outer, length, inner]) one pass over dx with 16-byte stores, the output index from a fast division; for
//     Generic layouts an element-wise walk of the merged dims.
//   max: dx = dy / ties where x equals the maximum y (NaN equal to a NaN maximum), 0 elsewhere, ties counted per
//     output. Rows and Columns use column tiles (as the column forward) with a shared-memory count, Generic a warp
//     per output. Two reads of x, one write of dx.
#include "fast_divmod.hpp"
#include "float_access.hpp"
#include "kernels/reduce_common.cuh"
#include "status.hpp"

namespace ge2::reduce {
namespace {

constexpr int kThreads = 256;

// ---- sum, mean ---------------------------------------------------------------------------------------------------
// dx[(o * length + r) * inner + i] = dy[o * inner + i] * scale, kPack elements per step. With inner > 1, kPack
// divides inner (a vector of dx reads a vector of dy); with inner == 1 it divides length (a vector of dx shares
// one dy).
template <typename T, int kPack, typename Index>
__global__ void __launch_bounds__(kThreads)
    broadcast_backward(const T* __restrict__ dy, T* __restrict__ dx, Index total, FastDivmod inner_divider,
                       FastDivmod slab_divider, Index inner, float scale) {
  const Index stride = static_cast<Index>(gridDim.x) * kThreads * kPack;
  for (Index e = (static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x) * kPack; e < total; e += stride) {
    Index within_slab;
    const Index o = slab_divider.divmod(e, within_slab);  // slab: one outer index, length * inner elements
    float values[kPack];
    if (inner == 1) {
      const float value = to_float(dy[o]) * scale;
#pragma unroll
      for (int i = 0; i < kPack; ++i) values[i] = value;
    } else {
      Index i;
      inner_divider.divmod(within_slab, i);
      load_floats<kPack>(dy + o * inner + i, values);
#pragma unroll
      for (int k = 0; k < kPack; ++k) values[k] *= scale;
    }
    store_floats<kPack>(dx + e, values);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    broadcast_backward_generic(const T* __restrict__ dy, T* __restrict__ dx, DimWalk dy_offsets, int64_t total,
                               float scale) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    dx[e] = from_float<T>(to_float(dy[dy_offsets.offset_of(e)]) * scale);
  }
}

// ---- max ---------------------------------------------------------------------------------------------------------
__device__ __forceinline__ bool is_tie(float value, float maximum) {
  return value == maximum || (value != value && maximum != maximum);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_backward_tiles(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                       T* __restrict__ dx, int64_t outer, int64_t length, int64_t inner) {
  __shared__ int shared_ties[kThreads];
  const int width = blockDim.x, lanes = blockDim.y;
  const int slot = threadIdx.y * width + threadIdx.x;
  const int64_t column_tiles = (inner + width - 1) / width;
  for (int64_t tile = blockIdx.x; tile < outer * column_tiles; tile += gridDim.x) {
    const int64_t o = tile / column_tiles, column = (tile % column_tiles) * width + threadIdx.x;
    const bool valid = column < inner;
    const int64_t out = o * inner + column, base = o * length * inner + column;
    const float maximum = valid ? to_float(y[out]) : 0.0f;
    int ties = 0;
    if (valid) {
#pragma unroll 4
      for (int64_t r = threadIdx.y; r < length; r += lanes) ties += is_tie(to_float(x[base + r * inner]), maximum);
    }
    shared_ties[slot] = ties;
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.y) < half) shared_ties[slot] += shared_ties[slot + half * width];
      __syncthreads();
    }
    ties = shared_ties[threadIdx.x];
    __syncthreads();  // the next tile overwrites shared_ties
    if (valid) {
      const T share = from_float<T>(to_float(dy[out]) / static_cast<float>(ties));
      const T zero = from_float<T>(0.0f);
#pragma unroll 4
      for (int64_t r = threadIdx.y; r < length; r += lanes) {
        const int64_t index = base + r * inner;
        dx[index] = is_tie(to_float(x[index]), maximum) ? share : zero;
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_backward_generic(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                         T* __restrict__ dx, GenericMaps maps, int64_t outputs, int64_t count) {
  constexpr int kWarpsPerBlock = kThreads / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t out = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; out < outputs;
       out += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t first = maps.kept.offset_of(out);
    const float maximum = to_float(y[out]);
    float ties = 0.0f;  // exact: a lane counts at most count / 32 ties, far below 2^24
    for (int64_t r = lane; r < count; r += 32) ties += is_tie(to_float(x[first + maps.reduced.offset_of(r)]), maximum);
    ties = warp_reduce(ties, SumOp());
    const T share = from_float<T>(to_float(dy[out]) / ties);
    const T zero = from_float<T>(0.0f);
    for (int64_t r = lane; r < count; r += 32) {
      const int64_t index = first + maps.reduced.offset_of(r);
      dx[index] = is_tie(to_float(x[index]), maximum) ? share : zero;
    }
  }
}

// ---- launchers ---------------------------------------------------------------------------------------------------
void launch_broadcast(const BackwardArgs& args, float scale, cudaStream_t stream) {
  const Layout& layout = args.layout;
  const bool fits_32_bits = layout.numel < (int64_t{1} << 31);
  // The vectorized run: inner when the kept tail is wider than 1, else the reduced run itself.
  const int64_t run = layout.inner > 1 ? layout.inner : layout.length;
  const bool aligned = is_aligned(args.dx, 16) && (layout.inner == 1 || is_aligned(args.dy, 16));
  const FastDivmod inner_divider(layout.inner), slab_divider(layout.length * layout.inner);
  dispatch_storage(args.dtype, run, aligned, [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    const unsigned grid = grid_blocks(layout.numel / kPack, kThreads);
    const auto* dy = static_cast<const T*>(args.dy);
    auto* dx = static_cast<T*>(args.dx);
    if (fits_32_bits) {
      broadcast_backward<T, kPack, uint32_t><<<grid, kThreads, 0, stream>>>(
          dy, dx, static_cast<uint32_t>(layout.numel), inner_divider, slab_divider,
          static_cast<uint32_t>(layout.inner), scale);
    } else {
      broadcast_backward<T, kPack, uint64_t><<<grid, kThreads, 0, stream>>>(
          dy, dx, static_cast<uint64_t>(layout.numel), inner_divider, slab_divider,
          static_cast<uint64_t>(layout.inner), scale);
    }
  });
  GE2_CHECK_LAUNCH("reduce broadcast_backward");
}

// dy offset of every element of dx: the output strides of the kept dims, 0 along the reduced ones.
DimWalk dy_offsets(const Layout& layout) {
  DimWalk walk;
  walk.ndim = layout.ndim;
  int64_t stride = 1;
  for (int d = layout.ndim - 1; d >= 0; --d) {
    walk.extent[d] = layout.extent[d];
    walk.stride[d] = layout.reduced[d] ? 0 : stride;
    if (!layout.reduced[d]) stride *= layout.extent[d];
  }
  return walk;
}

}  // namespace

void backward(const BackwardArgs& args, cudaStream_t stream) {
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  const Layout& layout = args.layout;
  if (layout.numel == 0) return;
  if (args.dy == nullptr) throw std::invalid_argument("dy: null device pointer");
  if (args.dx == nullptr) throw std::invalid_argument("dx: null device pointer");
  const bool fast_layout = layout.kind != Layout::Kind::Generic;
  if (args.reduction != Reduction::Max) {
    const float scale = output_scale(args.reduction, layout.count);
    if (fast_layout) {
      launch_broadcast(args, scale, stream);
      return;
    }
    const DimWalk walk = dy_offsets(layout);
    GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                          broadcast_backward_generic<scalar_t><<<grid_blocks(layout.numel, kThreads), kThreads, 0,
                                                                 stream>>>(
                              static_cast<const scalar_t*>(args.dy), static_cast<scalar_t*>(args.dx), walk,
                              layout.numel, scale));
    GE2_CHECK_LAUNCH("reduce broadcast_backward_generic");
    return;
  }
  if (args.x == nullptr) throw std::invalid_argument("x: null device pointer (max backward reads x)");
  if (args.y == nullptr) throw std::invalid_argument("y: null device pointer (max backward reads the forward output)");
  if (fast_layout) {
    int width = 1;
    while (width < 32 && width < layout.inner) width *= 2;
    const dim3 block(static_cast<unsigned>(width), static_cast<unsigned>(kThreads / width));
    GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                          max_backward_tiles<scalar_t>
                          <<<grid_blocks(layout.outer * ((layout.inner + width - 1) / width), 1), block, 0,
                             stream>>>(static_cast<const scalar_t*>(args.dy), static_cast<const scalar_t*>(args.x),
                                       static_cast<const scalar_t*>(args.y), static_cast<scalar_t*>(args.dx),
                                       layout.outer, layout.length, layout.inner));
    GE2_CHECK_LAUNCH("reduce max_backward_tiles");
    return;
  }
  const GenericMaps maps = generic_maps(layout);
  GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                        max_backward_generic<scalar_t><<<grid_blocks(layout.outputs, kThreads / 32), kThreads, 0,
                                                         stream>>>(
                            static_cast<const scalar_t*>(args.dy), static_cast<const scalar_t*>(args.x),
                            static_cast<const scalar_t*>(args.y), static_cast<scalar_t*>(args.dx), maps,
                            layout.outputs, layout.count));
  GE2_CHECK_LAUNCH("reduce max_backward_generic");
}

}  // namespace ge2::reduce
