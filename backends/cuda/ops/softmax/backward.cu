// softmax backward, from the forward output y and the output gradient dy, per row (or column) of the softmax axis:
//   softmax:     dx = y * (dy - dot),       dot = sum(dy * y)
//   log_softmax: dx = dy - exp(y) * dot,    dot = sum(dy)
// The same four kernels as the forward: warp_row and block_row hold y and dy in registers (each read once),
// block_row_two_pass reads them twice for rows of any length, strided handles any axis. Bytes moved: read y and dy,
// write dx.
#include "float_access.hpp"
#include "group_reduction.hpp"
#include "reduction.hpp"
#include "kernels/softmax_common.cuh"
#include "status.hpp"

namespace ge2::softmax {
namespace {

constexpr int kWarpThreads = 128;

__device__ __forceinline__ float dot_term(float y, float dy, bool log) { return log ? dy : dy * y; }

__device__ __forceinline__ float input_gradient(float y, float dy, float dot, bool log) {
  return log ? dy - __expf(y) * dot : y * (dy - dot);
}

// ---- warp_row ------------------------------------------------------------------------------------------------------
template <typename T, int kPack, int kPacksPerLane, int kWidth>
__global__ void __launch_bounds__(kWarpThreads)
    warp_row_backward(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                      int64_t n, bool log) {
  constexpr int kRowsPerBlock = kWarpThreads / kWidth;
  constexpr int kValues = kPack * kPacksPerLane;
  const int lane = threadIdx.x % kWidth;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t row = first + threadIdx.x / kWidth;
    const bool active = row < rows;
    float outputs[kValues], grads[kValues];
#pragma unroll
    for (int p = 0; p < kPacksPerLane; ++p) {
      const int64_t col = static_cast<int64_t>(p * kWidth + lane) * kPack;
      if (active && col < n) {
        load_floats<kPack>(y + row * n + col, outputs + p * kPack);
        load_floats<kPack>(dy + row * n + col, grads + p * kPack);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) outputs[p * kPack + i] = grads[p * kPack + i] = 0.0f;
      }
    }
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kValues; ++i) dot += dot_term(outputs[i], grads[i], log);
    dot = group_reduce<kWidth>(dot, SumOp());
#pragma unroll
    for (int i = 0; i < kValues; ++i) grads[i] = input_gradient(outputs[i], grads[i], dot, log);
#pragma unroll
    for (int p = 0; p < kPacksPerLane; ++p) {
      const int64_t col = static_cast<int64_t>(p * kWidth + lane) * kPack;
      if (active && col < n) store_floats<kPack>(dx + row * n + col, grads + p * kPack);
    }
  }
}

// ---- block_row -----------------------------------------------------------------------------------------------------
template <typename T, int kPack>
__global__ void __launch_bounds__(kBlockRowMaxThreads)
    block_row_backward(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                       int64_t n, bool log) {
  constexpr int kPacksPerThread = kBlockRowBackwardValues / kPack;
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* y_row = y + row * n;
    const T* dy_row = dy + row * n;
    float outputs[kBlockRowBackwardValues], grads[kBlockRowBackwardValues];  // 32-bit columns: n <= 8192
#pragma unroll
    for (int p = 0; p < kPacksPerThread; ++p) {
      const int col = (p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kPack;
      if (col < n) {
        load_floats<kPack>(y_row + col, outputs + p * kPack);
        load_floats<kPack>(dy_row + col, grads + p * kPack);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) outputs[p * kPack + i] = grads[p * kPack + i] = 0.0f;
      }
    }
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlockRowBackwardValues; ++i) dot += dot_term(outputs[i], grads[i], log);
    dot = block_reduce(dot, SumOp(), scratch);
#pragma unroll
    for (int p = 0; p < kPacksPerThread; ++p) {
      const int col = (p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kPack;
      if (col < n) {
        float result[kPack];
#pragma unroll
        for (int i = 0; i < kPack; ++i) {
          result[i] = input_gradient(outputs[p * kPack + i], grads[p * kPack + i], dot, log);
        }
        store_floats<kPack>(dx + row * n + col, result);
      }
    }
  }
}

// ---- block_row_two_pass --------------------------------------------------------------------------------------------
template <typename T, int kPack>
__global__ void __launch_bounds__(kTwoPassThreads)
    block_row_two_pass_backward(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                                int64_t n, bool log) {
  constexpr int64_t kStride = int64_t{kTwoPassThreads} * kPack;
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* y_row = y + row * n;
    const T* dy_row = dy + row * n;
    float dot = 0.0f;
    int64_t col = static_cast<int64_t>(threadIdx.x) * kPack;
    for (; col + (kTwoPassUnroll - 1) * kStride < n; col += kTwoPassUnroll * kStride) {
      float outputs[kTwoPassUnroll][kPack], grads[kTwoPassUnroll][kPack];
#pragma unroll
      for (int u = 0; u < kTwoPassUnroll; ++u) {
        load_floats<kPack>(y_row + col + u * kStride, outputs[u]);
        load_floats<kPack>(dy_row + col + u * kStride, grads[u]);
      }
#pragma unroll
      for (int u = 0; u < kTwoPassUnroll; ++u) {
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < kPack; ++i) partial += dot_term(outputs[u][i], grads[u][i], log);
        dot += partial;
      }
    }
    for (; col < n; col += kStride) {
      float outputs[kPack], grads[kPack];
      load_floats<kPack>(y_row + col, outputs);
      load_floats<kPack>(dy_row + col, grads);
#pragma unroll
      for (int i = 0; i < kPack; ++i) dot += dot_term(outputs[i], grads[i], log);
    }
    dot = block_reduce(dot, SumOp(), scratch);
    T* dx_row = dx + row * n;
#pragma unroll 4
    for (col = static_cast<int64_t>(threadIdx.x) * kPack; col < n; col += kStride) {
      float outputs[kPack], grads[kPack];
      load_floats<kPack>(y_row + col, outputs);
      load_floats<kPack>(dy_row + col, grads);
#pragma unroll
      for (int i = 0; i < kPack; ++i) grads[i] = input_gradient(outputs[i], grads[i], dot, log);
      store_floats<kPack>(dx_row + col, grads);
    }
  }
}

// ---- strided -------------------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kStridedThreads)
    strided_backward(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t outer, int64_t n,
                     int64_t inner, bool log) {
  __shared__ float shared_dot[kStridedThreads];
  const int width = blockDim.x, lanes = blockDim.y;
  const int slot = threadIdx.y * width + threadIdx.x;
  const int64_t column_tiles = (inner + width - 1) / width;
  for (int64_t tile = blockIdx.x; tile < outer * column_tiles; tile += gridDim.x) {
    const int64_t column = (tile % column_tiles) * width + threadIdx.x;
    const bool valid = column < inner;
    const int64_t base = (tile / column_tiles) * n * inner + column;
    float dot = 0.0f;
    if (valid) {
#pragma unroll 4
      for (int64_t j = threadIdx.y; j < n; j += lanes) {
        dot += dot_term(to_float(y[base + j * inner]), to_float(dy[base + j * inner]), log);
      }
    }
    shared_dot[slot] = dot;
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.y) < half) shared_dot[slot] += shared_dot[slot + half * width];
      __syncthreads();
    }
    dot = shared_dot[threadIdx.x];
    __syncthreads();  // the next tile overwrites shared_dot
    if (valid) {
#pragma unroll 4
      for (int64_t j = threadIdx.y; j < n; j += lanes) {
        const int64_t index = base + j * inner;
        dx[index] = from_float<T>(input_gradient(to_float(y[index]), to_float(dy[index]), dot, log));
      }
    }
  }
}

bool aligned(const BackwardArgs& args) {
  return is_aligned(args.y, 16) && is_aligned(args.dy, 16) && is_aligned(args.dx, 16);
}

}  // namespace

void launch_warp_row_backward(const BackwardArgs& args, cudaStream_t stream) {
  dispatch_storage(args.dtype, args.n, aligned(args), [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    auto launch = [&](auto packs_per_lane, auto width) {
      constexpr int kPacksPerLane = decltype(packs_per_lane)::value, kWidth = decltype(width)::value;
      warp_row_backward<T, kPack, kPacksPerLane, kWidth>
          <<<grid_blocks(args.outer, kWarpThreads / kWidth), kWarpThreads, 0, stream>>>(
              static_cast<const T*>(args.y), static_cast<const T*>(args.dy), static_cast<T*>(args.dx), args.outer,
              args.n, args.log);
    };
    dispatch_warp_row_shape<kPack>((args.n + kPack - 1) / kPack, launch);
  });
  GE2_CHECK_LAUNCH("softmax warp_row_backward");
}

void launch_block_row_backward(const BackwardArgs& args, cudaStream_t stream) {
  dispatch_storage(args.dtype, args.n, aligned(args), [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    constexpr int kPack = decltype(pack)::value;
    const int threads = block_row_threads(args.n, kPack, kBlockRowBackwardValues);
    block_row_backward<T, kPack><<<grid_blocks(args.outer, 1), threads, 0, stream>>>(
        static_cast<const T*>(args.y), static_cast<const T*>(args.dy), static_cast<T*>(args.dx), args.outer, args.n,
        args.log);
  });
  GE2_CHECK_LAUNCH("softmax block_row_backward");
}

void launch_block_row_two_pass_backward(const BackwardArgs& args, cudaStream_t stream) {
  dispatch_storage(args.dtype, args.n, aligned(args), [&](auto type, auto pack) {
    using T = typename decltype(type)::type;
    block_row_two_pass_backward<T, decltype(pack)::value><<<grid_blocks(args.outer, 1), kTwoPassThreads, 0, stream>>>(
        static_cast<const T*>(args.y), static_cast<const T*>(args.dy), static_cast<T*>(args.dx), args.outer, args.n,
        args.log);
  });
  GE2_CHECK_LAUNCH("softmax block_row_two_pass_backward");
}

void launch_strided_backward(const BackwardArgs& args, cudaStream_t stream) {
  const dim3 block = strided_block(args.inner);
  const unsigned grid = grid_blocks(args.outer * ((args.inner + block.x - 1) / block.x), 1);
  GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                        strided_backward<scalar_t><<<grid, block, 0, stream>>>(
                            static_cast<const scalar_t*>(args.y), static_cast<const scalar_t*>(args.dy),
                            static_cast<scalar_t*>(args.dx), args.outer, args.n, args.inner, args.log));
  GE2_CHECK_LAUNCH("softmax strided_backward");
}

}  // namespace ge2::softmax
