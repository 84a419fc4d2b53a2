// max_pool2d / avg_pool2d forward: one thread per output position and channel (NCHW) or per output position and
// group of kPack channels (NHWC, 16-byte loads and stores when channels allow). Every tap is read through L1;
// neighbouring outputs share their overlapping taps there, so DRAM sees x about once.
#include <cmath>

#include "dtype.hpp"
#include "float_access.hpp"
#include "pool_common.cuh"

namespace ge2::pool2d {
namespace {

template <typename T, int kPack, bool kMax, bool kChannelsLast, typename Index>
__global__ void window_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ indices,
                                      WindowParams p, Index work) {
  for (Index item = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; item < work;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = item, pack = 0, ow, oh;
    if (kChannelsLast) rest = p.channel_packs.divmod(rest, pack);
    rest = p.out_w_div.divmod(rest, ow);
    const Index outer = p.out_h_div.divmod(rest, oh);  // n (NHWC) or n * C + c (NCHW)
    // x offset of (ih, iw) = base + (ih * W + iw) * step
    const Index plane_inputs = static_cast<Index>(p.height) * static_cast<Index>(p.width);
    const Index base = kChannelsLast ? outer * plane_inputs * static_cast<Index>(p.channels) + pack * kPack
                                     : outer * plane_inputs;
    const Index step = kChannelsLast ? static_cast<Index>(p.channels) : 1;
    const int h0 = static_cast<int>(oh) * p.stride_h - p.pad_h;
    const int w0 = static_cast<int>(ow) * p.stride_w - p.pad_w;

    float result[kPack];
    int32_t argmax[kPack];
#pragma unroll
    for (int i = 0; i < kPack; ++i) {
      result[i] = kMax ? -INFINITY : 0.0f;
      argmax[i] = -1;
    }
    for (int kh = 0; kh < p.kernel_h; ++kh) {
      const int ih = h0 + kh * p.dilation_h;
      if (ih < 0 || ih >= p.height) continue;
      for (int kw = 0; kw < p.kernel_w; ++kw) {
        const int iw = w0 + kw * p.dilation_w;
        if (iw < 0 || iw >= p.width) continue;
        const int plane = ih * p.width + iw;
        float values[kPack];
        load_floats<kPack>(x + base + static_cast<Index>(plane) * step, values);
#pragma unroll
        for (int i = 0; i < kPack; ++i) {
          if (kMax) {
            // The first NaN wins and stays (max of anything with NaN is NaN); among equal values the first tap.
            if (values[i] > result[i] || (isnan(values[i]) && !isnan(result[i]))) {
              result[i] = values[i];
              argmax[i] = plane;
            }
          } else {
            result[i] += values[i];
          }
        }
      }
    }
    if (!kMax) {
      const float scale = 1.0f / avg_divisor(p, static_cast<int>(oh), static_cast<int>(ow));
#pragma unroll
      for (int i = 0; i < kPack; ++i) result[i] *= scale;
    }
    const Index out = item * kPack;  // outputs are laid out in the order of `item`
    store_floats<kPack>(y + out, result);
    if (kMax) store_indices<kPack>(indices + out, argmax);
  }
}

}  // namespace

void launch_window_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Window& w = args.window;
  // NHWC vectorizes channels (x, y and the argmax indices); NCHW takes one output per thread.
  const bool aligned = is_aligned(args.x, 16) && is_aligned(args.y, 16) &&
                       (args.mode == Mode::Avg || is_aligned(args.indices, 16));
  const auto launch = [&](auto tag, auto pack, auto max, auto layout, auto index) {
    using T = typename decltype(tag)::type;
    using Index = decltype(index);
    constexpr int kPack = decltype(pack)::value;
    const int64_t work = w.batch * w.channels * w.out_height * w.out_width / kPack;
    window_forward_kernel<T, kPack, decltype(max)::value == 1, decltype(layout)::value == 1, Index>
        <<<grid_for(work), kThreads, 0, stream>>>(static_cast<const T*>(args.x), static_cast<T*>(args.y),
                                                  args.indices, WindowParams(w, kPack), static_cast<Index>(work));
    GE2_CHECK_LAUNCH("pool2d window_forward_kernel");
  };
  dispatch_window<false>(args.dtype, args.mode, w, aligned, launch);
}

}  // namespace ge2::pool2d
