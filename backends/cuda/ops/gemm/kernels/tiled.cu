// GE2's own GEMM (candidate "tiled"): no cuBLAS, every dtype, every activation, any alignment. It is the path that
// always works and the independent check on cuBLASLt, not a fast path: 64x64 output tiles, K in steps of 16 through
// shared memory (as float), 4x4 outputs per thread, the whole epilogue fused.
#include "api.hpp"
#include "status.hpp"

namespace ge2::gemm {
namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    tiled_gemm(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c, const T* __restrict__ bias,
               T* __restrict__ y, T* __restrict__ preact, int64_t m, int64_t n, int64_t k, bool trans_a,
               bool trans_b, float alpha, float beta, bool residual_after_act, Act act, float slope) {
  __shared__ float a_tile[kTileK][kTileM + 1];  // +1: rows of different k land in different banks
  __shared__ float b_tile[kTileK][kTileN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileM, col0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  float acc[4][4] = {};

  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTileM * kTileK; i += kThreads) {
      const int r = i / kTileK, kk = i % kTileK;  // op(A)[row0 + r][k0 + kk]
      const int64_t row = row0 + r, col = k0 + kk;
      float value = 0.0f;
      if (row < m && col < k) value = to_float(trans_a ? a[col * m + row] : a[row * k + col]);
      a_tile[kk][r] = value;
    }
    for (int i = threadIdx.x; i < kTileK * kTileN; i += kThreads) {
      const int kk = i / kTileN, cc = i % kTileN;  // op(B)[k0 + kk][col0 + cc]
      const int64_t row = k0 + kk, col = col0 + cc;
      float value = 0.0f;
      if (row < k && col < n) value = to_float(trans_b ? b[col * k + row] : b[row * n + col]);
      b_tile[kk][cc] = value;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a_values[4], b_values[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a_values[i] = a_tile[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b_values[j] = b_tile[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a_values[i] * b_values[j];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx + 16 * j;
      if (col >= n) continue;
      float z = alpha * acc[i][j];
      const float residual = c != nullptr ? beta * to_float(c[row * n + col]) : 0.0f;
      if (!residual_after_act) z += residual;
      if (bias != nullptr) z += to_float(bias[col]);
      if (preact != nullptr) preact[row * n + col] = from_float<T>(z);
      const float activated = apply_act(act, z, slope);
      y[row * n + col] = from_float<T>(residual_after_act ? activated + residual : activated);
    }
  }
}

}  // namespace

void launch_tiled(const ForwardArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((args.n + kTileN - 1) / kTileN),
                  static_cast<unsigned>((args.m + kTileM - 1) / kTileM));
  if (grid.y > 65535) throw std::invalid_argument("m: the tiled kernel supports m <= 4194240");
  GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                        tiled_gemm<scalar_t><<<grid, kThreads, 0, stream>>>(
                            static_cast<const scalar_t*>(args.a), static_cast<const scalar_t*>(args.b),
                            static_cast<const scalar_t*>(args.c), static_cast<const scalar_t*>(args.bias),
                            static_cast<scalar_t*>(args.y), static_cast<scalar_t*>(args.preact), args.m, args.n,
                            args.k, args.trans_a, args.trans_b, args.alpha, args.beta, args.residual_after_act,
                            args.act, args.slope));
  GE2_CHECK_LAUNCH("gemm tiled_gemm");
}

}  // namespace ge2::gemm
