// Pooling backward, as gathers (no atomics, deterministic): one thread per input element (NCHW) or per input
// position and group of kPack channels (NHWC) visits the outputs whose windows can hold it.
//   max: adds dy of every such output whose saved argmax is this element
//   avg: adds dy / divisor of every such output (without dilation every window in the range holds the element)
// global_avg_pool backward: dx = dy / spatial, broadcast.
#include "dtype.hpp"
#include "float_access.hpp"
#include "kernels/pool_common.cuh"
#include "storage_dispatch.hpp"

namespace ge2::pool2d {
namespace {

// The outputs [first, last) along one axis whose windows (span = dilation * (kernel - 1) + 1 taps) reach input i.
__device__ __forceinline__ void output_range(int64_t i, int pad, int stride, int span, int64_t outputs,
                                             int64_t& first, int64_t& last) {
  const int64_t padded = i + pad;
  first = padded < span ? 0 : (padded - span) / stride + 1;
  last = min(padded / stride + 1, outputs);
}

template <typename T, int kPack, bool kMax, bool kChannelsLast, typename Index>
__global__ void window_backward_kernel(const T* __restrict__ dy, const int32_t* __restrict__ indices,
                                       T* __restrict__ dx, WindowParams p, Index work) {
  const int span_h = p.dilation_h * (p.kernel_h - 1) + 1, span_w = p.dilation_w * (p.kernel_w - 1) + 1;
  for (Index item = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; item < work;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index rest = item, pack = 0, iw, ih;
    if (kChannelsLast) rest = p.channel_packs.divmod(rest, pack);
    rest = p.in_w_div.divmod(rest, iw);
    const Index outer = p.in_h_div.divmod(rest, ih);  // n (NHWC) or n * C + c (NCHW)
    const Index base = kChannelsLast ? outer * p.out_height * p.out_width * p.channels + pack * kPack
                                     : outer * p.out_height * p.out_width;
    const Index step = kChannelsLast ? p.channels : 1;
    const int32_t plane = static_cast<int32_t>(ih * p.width + iw);
    int64_t oh0, oh1, ow0, ow1;
    output_range(ih, p.pad_h, p.stride_h, span_h, p.out_height, oh0, oh1);
    output_range(iw, p.pad_w, p.stride_w, span_w, p.out_width, ow0, ow1);

    float grad[kPack] = {};
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const Index out = base + static_cast<Index>(oh * p.out_width + ow) * step;
        float values[kPack];
        load_floats<kPack>(dy + out, values);
        if (kMax) {
#pragma unroll
          for (int i = 0; i < kPack; ++i) {
            if (indices[out + i] == plane) grad[i] += values[i];
          }
        } else {
          const float scale = 1.0f / avg_divisor(p, oh, ow);
#pragma unroll
          for (int i = 0; i < kPack; ++i) grad[i] += values[i] * scale;
        }
      }
    }
    store_floats<kPack>(dx + item * kPack, grad);  // dx is laid out in the order of `item`
  }
}

template <typename T, int kPack, bool kChannelsLast>
__global__ void global_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, int64_t vectors,
                                       int64_t channels, int64_t spatial) {
  const float scale = 1.0f / static_cast<float>(spatial);
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < vectors;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int64_t element = item * kPack;
    float values[kPack];
    if (kChannelsLast) {  // kPack consecutive channels of one position (channels % kPack == 0)
      const int64_t channel = element % channels, n = element / (channels * spatial);
      load_floats<kPack>(dy + n * channels + channel, values);
    } else {  // kPack consecutive positions of one (n, c) plane (spatial % kPack == 0)
      const float value = to_float(dy[element / spatial]);
#pragma unroll
      for (int i = 0; i < kPack; ++i) values[i] = value;
    }
#pragma unroll
    for (int i = 0; i < kPack; ++i) values[i] *= scale;
    store_floats<kPack>(dx + element, values);
  }
}

}  // namespace

void launch_window_backward(const BackwardArgs& args, cudaStream_t stream) {
  const Window& w = args.window;
  const bool aligned = is_aligned(args.dy, 16) && is_aligned(args.dx, 16);
  dispatch_window(args.dtype, args.mode, w, aligned, [&](auto tag, auto pack, auto max, auto channels_last, auto index) {
    using T = typename decltype(tag)::type;
    using Index = decltype(index);
    constexpr int kPack = decltype(pack)::value;
    const int64_t work = w.batch * w.channels * w.height * w.width / kPack;
    window_backward_kernel<T, kPack, decltype(max)::value == 1, decltype(channels_last)::value == 1, Index>
        <<<grid_for(work), kThreads, 0, stream>>>(static_cast<const T*>(args.dy), args.indices,
                                                  static_cast<T*>(args.dx), WindowParams(w, kPack),
                                                  static_cast<Index>(work));
    GE2_CHECK_LAUNCH("pool2d window_backward_kernel");
  });
}

void launch_global_backward(const GlobalArgs& args, cudaStream_t stream) {
  const bool channels_last = args.layout == Layout::NHWC;
  const bool aligned = is_aligned(args.input, 16) && is_aligned(args.output, 16);
  const int64_t elements = args.batch * args.channels * args.spatial;
  dispatch_storage(args.dtype, channels_last ? args.channels : args.spatial, aligned, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int kPack = decltype(width)::value;
    const int64_t vectors = elements / kPack;
    const auto* dy = static_cast<const T*>(args.input);
    auto* dx = static_cast<T*>(args.output);
    if (channels_last) {
      global_backward_kernel<T, kPack, true><<<grid_for(vectors), kThreads, 0, stream>>>(dy, dx, vectors,
                                                                                        args.channels, args.spatial);
    } else {
      global_backward_kernel<T, kPack, false><<<grid_for(vectors), kThreads, 0, stream>>>(dy, dx, vectors,
                                                                                         args.channels, args.spatial);
    }
    GE2_CHECK_LAUNCH("pool2d global_backward_kernel");
  });
}

}  // namespace ge2::pool2d
