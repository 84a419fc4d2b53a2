// depthwise: GE2's direct depthwise convolution (groups == C == K: one filter per channel), forward only, NCHW or
// NHWC, float32/float16/bfloat16. A thread computes whole outputs (grid-stride over y in its own layout, so NHWC
// neighbours are neighbouring channels and read x coalesced): the R x S taps of one channel accumulated in float32,
// then the epilogue (bias, residual, activation, clip) in float32, y rounded once. It exists for the 16-bit
// depthwise convolutions with a fused epilogue that nothing else ran fast: cuDNN's runtime fusion has no engine for
// them, legacy cuDNN would round before the epilogue, and im2col_gemm took 21.4 of EfficientNet-B0's 22.7 ms on the
// H200 (batch 32, float16).
#include <algorithm>

#include "api.hpp"
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
