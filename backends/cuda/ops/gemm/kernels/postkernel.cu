// The fused bias/residual/activation pass that follows a plain cuBLASLt matmul (candidate cublaslt_postkernel):
//   z = acc + beta * C + bias[col]; preact = z; y = act(z)
// or, with the residual after the activation, z = acc + bias[col]; preact = z; y = act(z) + beta * C.
// One read of acc (and C), one write of y (and preact): bandwidth-bound, so 16-byte accesses when N and every
// pointer allow them.
#include "api.hpp"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::gemm {
namespace {

template <typename T, int kVec>
__global__ void postkernel(const T* __restrict__ acc, const T* __restrict__ c, const T* __restrict__ bias,
                           T* __restrict__ y, T* __restrict__ preact, int64_t total, int64_t n, float beta,
                           bool residual_after_act, Act act, float slope) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; base < total;
       base += stride) {
    // kVec divides n, so a vector never crosses a row and its bias entries are contiguous.
    const Pack<T, kVec> acc_pack = load_pack<T, kVec>(acc + base);
    Pack<T, kVec> c_pack, bias_pack, y_pack, z_pack;
    if (c != nullptr) c_pack = load_pack<T, kVec>(c + base);
    if (bias != nullptr) bias_pack = load_pack<T, kVec>(bias + base % n);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float z = to_float(acc_pack.values[i]);
      const float residual = c != nullptr ? beta * to_float(c_pack.values[i]) : 0.0f;
      if (!residual_after_act) z += residual;
      if (bias != nullptr) z += to_float(bias_pack.values[i]);
      z_pack.values[i] = from_float<T>(z);
      const float activated = apply_act(act, z, slope);
      y_pack.values[i] = from_float<T>(residual_after_act ? activated + residual : activated);
    }
    if (preact != nullptr) store_pack<T, kVec>(preact + base, z_pack);
    store_pack<T, kVec>(y + base, y_pack);
  }
}

template <typename T>
void launch_typed(const T* acc, const T* c, const T* bias, T* y, T* preact, int64_t m, int64_t n, float beta,
                  bool residual_after_act, Act act, float slope, cudaStream_t stream) {
  constexpr int kVec = kPackSize<T>;
  const int64_t total = m * n;
  const bool vectorizable = n % kVec == 0 && is_aligned(acc, 16) && is_aligned(y, 16) &&
                            (c == nullptr || is_aligned(c, 16)) && (bias == nullptr || is_aligned(bias, 16)) &&
                            (preact == nullptr || is_aligned(preact, 16));
  constexpr int kThreads = 256;
  const int64_t work = vectorizable ? total / kVec : total;
  const int blocks = static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 132 * 16));
  if (vectorizable) {
    postkernel<T, kVec><<<blocks, kThreads, 0, stream>>>(acc, c, bias, y, preact, total, n, beta,
                                                         residual_after_act, act, slope);
  } else {
    postkernel<T, 1><<<blocks, kThreads, 0, stream>>>(acc, c, bias, y, preact, total, n, beta, residual_after_act,
                                                      act, slope);
  }
  GE2_CHECK_LAUNCH("gemm postkernel");
}

}  // namespace

void launch_postkernel(const void* acc, const void* c, const void* bias, void* y, void* preact, int64_t m, int64_t n,
                       DType dtype, float beta, bool residual_after_act, Act act, float slope,
                       cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype",
                        launch_typed<scalar_t>(static_cast<const scalar_t*>(acc), static_cast<const scalar_t*>(c),
                                               static_cast<const scalar_t*>(bias), static_cast<scalar_t*>(y),
                                               static_cast<scalar_t*>(preact), m, n, beta, residual_after_act, act,
                                               slope, stream));
}

}  // namespace ge2::gemm
