// depthwise: GE2's direct depthwise convolution (groups == C == K: one filter per channel), forward only, NCHW or
// NHWC, float32/float16/bfloat16. A thread computes whole outputs (grid-stride over y in its own layout, so NHWC
// neighbours are neighbouring channels and read x coalesced): the R x S taps of one channel accumulated in float32,
// then the epilogue (bias, residual, activation, clip) in float32, y rounded once. It exists for the 16-bit
// depthwise convolutions with a fused epilogue that nothing else ran fast: cuDNN's runtime fusion has no engine for
// them, legacy cuDNN would round before the epilogue, and im2col_gemm took 21.4 of EfficientNet-B0's 22.7 ms on the
// H200 (batch 32, float16).
// The 16-bit NHWC case with channels a multiple of 8 (every depthwise conv of EfficientNet and MobileNet) runs
// depthwise_nhwc_vec8: a thread takes 8 neighbouring channels of one output pixel, so every tap is one 16-byte load
// of x; the block's filters sit in shared memory tap-major (as floats), so a tap's 8 weights are two float4 reads.
// The scalar kernel took 3.1 of EfficientNet-B0's 4.7 ms (float16, batch 32, H200, GPU call 1 of session 31): a
// 2-byte load and a global filter read per tap.
#include <algorithm>
#include <cstdint>

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

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

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
