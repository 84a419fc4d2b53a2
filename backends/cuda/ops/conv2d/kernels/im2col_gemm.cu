// im2col_gemm: the data-movement kernels around the batched cuBLASLt GEMM (im2col, its col2im adjoint, the fused
// bias/residual/activation epilogue, the output gradient and the bias gradient). Grid-stride loops, int64 indexing.
#include <algorithm>

#include "api.hpp"
#include "reduction.hpp"
#include "status.hpp"

namespace ge2::conv2d {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t elements) {
  return static_cast<unsigned>(std::min<int64_t>((elements + kThreads - 1) / kThreads, 132 * 32));
}

// Input row/column of output position (p, q) under filter tap (r, s); outside [0, H) x [0, W) means padding.
struct Geometry {
  int64_t n, c, h, w, k, r, s, p, q, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w, groups;
  explicit Geometry(const Shape& shape)
      : n(shape.n), c(shape.c), h(shape.h), w(shape.w), k(shape.k), r(shape.r), s(shape.s), p(shape.p),
        q(shape.q), stride_h(shape.stride_h), stride_w(shape.stride_w), pad_top(shape.pad_top),
        pad_left(shape.pad_left), dilation_h(shape.dilation_h), dilation_w(shape.dilation_w),
        groups(shape.groups) {}
};

// NCHW col: [C][R][S][N][P][Q] (= [groups][C/g * R * S][N * P * Q]).
template <typename T>
__global__ void im2col_nchw(Geometry g, const T* __restrict__ x, T* __restrict__ col, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = e;
    const int64_t q = rest % g.q; rest /= g.q;
    const int64_t p = rest % g.p; rest /= g.p;
    const int64_t n = rest % g.n; rest /= g.n;
    const int64_t s = rest % g.s; rest /= g.s;
    const int64_t r = rest % g.r;
    const int64_t c = rest / g.r;
    const int64_t hi = p * g.stride_h - g.pad_top + r * g.dilation_h;
    const int64_t wi = q * g.stride_w - g.pad_left + s * g.dilation_w;
    const bool inside = hi >= 0 && hi < g.h && wi >= 0 && wi < g.w;
    col[e] = inside ? x[((n * g.c + c) * g.h + hi) * g.w + wi] : from_float<T>(0.0f);
  }
}

// NHWC col: [groups][N][P][Q][R][S][C/g].
template <typename T>
__global__ void im2col_nhwc(Geometry g, const T* __restrict__ x, T* __restrict__ col, int64_t total) {
  const int64_t cg_size = g.c / g.groups;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = e;
    const int64_t cg = rest % cg_size; rest /= cg_size;
    const int64_t s = rest % g.s; rest /= g.s;
    const int64_t r = rest % g.r; rest /= g.r;
    const int64_t q = rest % g.q; rest /= g.q;
    const int64_t p = rest % g.p; rest /= g.p;
    const int64_t n = rest % g.n;
    const int64_t group = rest / g.n;
    const int64_t hi = p * g.stride_h - g.pad_top + r * g.dilation_h;
    const int64_t wi = q * g.stride_w - g.pad_left + s * g.dilation_w;
    const bool inside = hi >= 0 && hi < g.h && wi >= 0 && wi < g.w;
    col[e] = inside ? x[((n * g.h + hi) * g.w + wi) * g.c + group * cg_size + cg] : from_float<T>(0.0f);
  }
}

// dx[n, c, h, w] = sum of the dcol entries that im2col copied from it (the taps (r, s) whose output position lands
// on the stride grid). A gather, so every dx element is written once, without atomics.
template <typename T>
__global__ void col2im(Geometry g, bool nhwc, const float* __restrict__ dcol, T* __restrict__ dx, int64_t total) {
  const int64_t cg_size = g.c / g.groups;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = e, n, c, h, w;
    if (nhwc) {
      c = rest % g.c; rest /= g.c;
      w = rest % g.w; rest /= g.w;
      h = rest % g.h;
      n = rest / g.h;
    } else {
      w = rest % g.w; rest /= g.w;
      h = rest % g.h; rest /= g.h;
      c = rest % g.c;
      n = rest / g.c;
    }
    const int64_t group = c / cg_size, cg = c % cg_size;
    float sum = 0.0f;
    for (int64_t r = 0; r < g.r; ++r) {
      const int64_t hp = h + g.pad_top - r * g.dilation_h;
      if (hp < 0 || hp % g.stride_h != 0 || hp / g.stride_h >= g.p) continue;
      const int64_t p = hp / g.stride_h;
      for (int64_t s = 0; s < g.s; ++s) {
        const int64_t wq = w + g.pad_left - s * g.dilation_w;
        if (wq < 0 || wq % g.stride_w != 0 || wq / g.stride_w >= g.q) continue;
        const int64_t q = wq / g.stride_w;
        const int64_t index =
            nhwc ? ((((group * g.n + n) * g.p + p) * g.q + q) * g.r + r) * g.s * cg_size + s * cg_size + cg
                 : ((((c * g.r + r) * g.s + s) * g.n + n) * g.p + p) * g.q + q;
        sum += dcol[index];
      }
    }
    dx[e] = from_float<T>(sum);
  }
}

// Output element (in y's layout) -> its index in the GEMM layout (NCHW: [K][N][P*Q]; NHWC: the same as y's) and
// its channel; `same` says the GEMM layout is y's (NHWC, or an accumulator already laid out as y).
__device__ __forceinline__ int64_t gemm_index(const Geometry& g, bool nhwc, int64_t out, int64_t* channel,
                                              bool same = false) {
  const int64_t pq = g.p * g.q;
  if (nhwc) {
    *channel = out % g.k;
    return out;
  }
  const int64_t spatial = out % pq, rest = out / pq;
  *channel = rest % g.k;
  return same ? out : (*channel * g.n + rest / g.k) * pq + spatial;
}

// y = clip(act(acc + bias + residual)) in float32, rounded once. acc and y may be one float32 buffer (the cudnn
// candidate's in-place epilogue: each element is read and then written by the same thread), hence no __restrict__.
template <typename T>
__global__ void epilogue(Geometry g, bool nhwc, bool acc_in_y_layout, const float* acc, const T* __restrict__ bias,
                         const T* __restrict__ residual, T* y, Act act, float slope, float clip_low, float clip_high,
                         int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t channel;
    float z = acc[gemm_index(g, nhwc, e, &channel, acc_in_y_layout)];
    if (bias != nullptr) z += to_float(bias[channel]);
    if (residual != nullptr) z += to_float(residual[e]);
    y[e] = from_float<T>(clip_value(apply_act(act, z, slope), clip_low, clip_high));
  }
}

template <typename T>
__global__ void output_grad(Geometry g, bool nhwc, const T* __restrict__ dy, const float* __restrict__ acc,
                           const T* __restrict__ bias, T* __restrict__ dz, Act act, float slope, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t channel;
    const int64_t index = gemm_index(g, nhwc, e, &channel);
    float grad = to_float(dy[e]);
    if (act != Act::None) {
      float z = acc[index];
      if (bias != nullptr) z += to_float(bias[channel]);
      grad *= act_derivative(act, z, slope);
    }
    dz[index] = from_float<T>(grad);
  }
}

// One block per output channel. NHWC: a column of stride K; NCHW GEMM layout: a contiguous row; NCHW y layout:
// N runs of P*Q.
template <typename T>
__global__ void bias_grad(const T* __restrict__ dz, T* __restrict__ dbias, int64_t rows, int64_t k, int64_t pq,
                          bool nhwc, bool gemm_layout) {
  __shared__ float scratch[32];
  const int64_t channel = blockIdx.x;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const int64_t index = nhwc ? i * k + channel
                               : (gemm_layout ? channel * rows + i : (i / pq * k + channel) * pq + i % pq);
    sum += to_float(dz[index]);
  }
  sum = block_reduce(sum, SumOp{}, scratch);
  if (threadIdx.x == 0) dbias[channel] = from_float<T>(sum);
}

}  // namespace

void launch_im2col(const Shape& shape, const void* x, void* col, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(im2col_col_elements(shape));
  const Geometry g(shape);
  GE2_DISPATCH_FLOATING(shape.dtype, "dtype", {
    if (shape.layout == Layout::NHWC) {
      im2col_nhwc<<<grid_for(total), kThreads, 0, stream>>>(g, static_cast<const scalar_t*>(x),
                                                            static_cast<scalar_t*>(col), total);
    } else {
      im2col_nchw<<<grid_for(total), kThreads, 0, stream>>>(g, static_cast<const scalar_t*>(x),
                                                            static_cast<scalar_t*>(col), total);
    }
  });
  GE2_CHECK_LAUNCH("im2col");
}

void launch_col2im(const Shape& shape, const float* dcol, void* dx, cudaStream_t stream) {
  const int64_t total = shape.n * shape.c * shape.h * shape.w;
  GE2_DISPATCH_FLOATING(shape.dtype, "dtype", {
    col2im<<<grid_for(total), kThreads, 0, stream>>>(Geometry(shape), shape.layout == Layout::NHWC, dcol,
                                                     static_cast<scalar_t*>(dx), total);
  });
  GE2_CHECK_LAUNCH("col2im");
}

void launch_epilogue(const ForwardArgs& args, const float* acc, bool acc_in_y_layout, cudaStream_t stream) {
  const Shape& shape = args.shape;
  const int64_t total = shape.n * shape.k * shape.p * shape.q;
  GE2_DISPATCH_FLOATING(shape.dtype, "dtype", {
    epilogue<<<grid_for(total), kThreads, 0, stream>>>(
        Geometry(shape), shape.layout == Layout::NHWC, acc_in_y_layout, acc, static_cast<const scalar_t*>(args.bias),
        static_cast<const scalar_t*>(args.residual), static_cast<scalar_t*>(args.y), args.act, args.slope,
        args.clip_low, args.clip_high, total);
  });
  GE2_CHECK_LAUNCH("epilogue");
}

void launch_output_grad(const Shape& shape, const void* dy, const float* acc, const void* bias, void* dz, Act act,
                        float slope, cudaStream_t stream) {
  const int64_t total = shape.n * shape.k * shape.p * shape.q;
  GE2_DISPATCH_FLOATING(shape.dtype, "dtype", {
    output_grad<<<grid_for(total), kThreads, 0, stream>>>(Geometry(shape), shape.layout == Layout::NHWC,
                                                          static_cast<const scalar_t*>(dy), acc,
                                                          static_cast<const scalar_t*>(bias),
                                                          static_cast<scalar_t*>(dz), act, slope, total);
  });
  GE2_CHECK_LAUNCH("output_grad");
}

void launch_bias_grad(const Shape& shape, const void* dz, void* dbias, bool gemm_layout, cudaStream_t stream) {
  const int64_t rows = shape.n * shape.p * shape.q;
  GE2_DISPATCH_FLOATING(shape.dtype, "dtype", {
    bias_grad<<<static_cast<unsigned>(shape.k), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(dz), static_cast<scalar_t*>(dbias), rows, shape.k, shape.p * shape.q,
        shape.layout == Layout::NHWC, gemm_layout);
  });
  GE2_CHECK_LAUNCH("bias_grad");
}

}  // namespace ge2::conv2d
