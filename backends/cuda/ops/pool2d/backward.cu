// Pooling backward, as gathers (no atomics, deterministic): a thread visits the outputs whose windows can hold its
// input elements and adds up their dy.
//   max: adds dy of every such output whose saved argmax is this element
//   avg: adds dy / divisor of every such output (without dilation every window in the range holds the element)
// NHWC: a thread takes one input position and kPack channels (16-byte dy and dx accesses). NCHW: a thread takes
// kPack consecutive input columns of one row (W % kPack == 0; a 16-byte dx store) and walks the union of their
// output ranges once, so the index arithmetic and the dy and argmax loads are shared by the kPack elements.
// global_avg_pool backward: dx = dy / spatial, broadcast.
#include "dtype.hpp"
#include "float_access.hpp"
#include "kernels/pool_common.cuh"
#include "storage_dispatch.hpp"

namespace ge2::pool2d {
namespace {

// The outputs [first, last) along one axis whose windows (span = dilation * (kernel - 1) + 1 taps) reach input i.
__device__ __forceinline__ void output_range(int i, int pad, int stride, int span, int outputs, int& first,
                                             int& last) {
  const int padded = i + pad;
  first = padded < span ? 0 : (padded - span) / stride + 1;
  last = min(padded / stride + 1, outputs);
}

template <typename T, int kPack, bool kMax, bool kChannelsLast, typename Index>
__global__ void window_backward_kernel(const T* __restrict__ dy, const int32_t* __restrict__ indices,
                                       T* __restrict__ dx, WindowParams p, Index work) {
  constexpr int kColumns = kChannelsLast ? 1 : kPack;  // input columns per thread
  const int span_h = p.dilation_h * (p.kernel_h - 1) + 1, span_w = p.dilation_w * (p.kernel_w - 1) + 1;
  const Index plane_outputs = static_cast<Index>(p.out_height) * static_cast<Index>(p.out_width);
  for (Index item = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; item < work;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    // item = ((n * H + ih) * W + iw) * channel_packs + pack (NHWC) or ((n * C + c) * H + ih) * W / kPack + group
    // (NCHW); dx is laid out in the order of `item`.
    Index rest = item, pack = 0, column_group, row;
    if (kChannelsLast) rest = p.channel_packs.divmod(rest, pack);
    rest = p.in_w_groups.divmod(rest, column_group);
    const Index outer = p.in_h_div.divmod(rest, row);  // n (NHWC) or n * C + c (NCHW)
    const int ih = static_cast<int>(row), iw = static_cast<int>(column_group) * kColumns;
    const Index base = kChannelsLast ? outer * plane_outputs * static_cast<Index>(p.channels) + pack * kPack
                                     : outer * plane_outputs;
    const Index step = kChannelsLast ? static_cast<Index>(p.channels) : 1;
    const int plane = ih * p.width + iw;  // the argmax value that names the first element
    int oh0, oh1, ow0, ow1, unused;
    output_range(ih, p.pad_h, p.stride_h, span_h, p.out_height, oh0, oh1);
    output_range(iw, p.pad_w, p.stride_w, span_w, p.out_width, ow0, unused);
    output_range(iw + kColumns - 1, p.pad_w, p.stride_w, span_w, p.out_width, unused, ow1);

    float grad[kPack] = {};
    for (int oh = oh0; oh < oh1; ++oh) {
      for (int ow = ow0; ow < ow1; ++ow) {
        const Index out = base + static_cast<Index>(oh * p.out_width + ow) * step;
        if constexpr (kChannelsLast) {
          float values[kPack];
          load_floats<kPack>(dy + out, values);
          if constexpr (kMax) {
            int32_t argmax[kPack];
            load_indices<kPack>(indices + out, argmax);
#pragma unroll
            for (int i = 0; i < kPack; ++i) {
              if (argmax[i] == plane) grad[i] += values[i];
            }
          } else {
            const float scale = 1.0f / avg_divisor(p, oh, ow);
#pragma unroll
            for (int i = 0; i < kPack; ++i) grad[i] += values[i] * scale;
          }
        } else {
          float value;
          load_floats<1>(dy + out, &value);
          if constexpr (kMax) {
            // An output names column iw + j as its argmax only if its window holds that element, i.e. if it is in
            // that column's own range: the other outputs of the union add nothing to grad[j].
            const int column = indices[out] - plane;
#pragma unroll
            for (int j = 0; j < kPack; ++j) {
              if (column == j) grad[j] += value;
            }
          } else {
            const float term = value * (1.0f / avg_divisor(p, oh, ow));
            const int w0 = ow * p.stride_w - p.pad_w;
#pragma unroll
            for (int j = 0; j < kPack; ++j) {
              // the window [w0, w0 + kernel_w) holds column iw + j (one unsigned compare for both bounds)
              if (static_cast<unsigned>(iw + j - w0) < static_cast<unsigned>(p.kernel_w)) grad[j] += term;
            }
          }
        }
      }
    }
    store_floats<kPack>(dx + item * kPack, grad);
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
  const bool channels_last = w.layout == Layout::NHWC;
  // NHWC vectorizes channels (dy, dx and the argmax indices); NCHW groups input columns (only dx is vectorized).
  const bool aligned = is_aligned(args.dx, 16) &&
                       (!channels_last || (is_aligned(args.dy, 16) &&
                                           (args.mode == Mode::Avg || is_aligned(args.indices, 16))));
  const auto launch = [&](auto tag, auto pack, auto max, auto layout, auto index) {
    using T = typename decltype(tag)::type;
    using Index = decltype(index);
    constexpr int kPack = decltype(pack)::value;
    const int64_t work = w.batch * w.channels * w.height * w.width / kPack;
    window_backward_kernel<T, kPack, decltype(max)::value == 1, decltype(layout)::value == 1, Index>
        <<<grid_for(work), kThreads, 0, stream>>>(static_cast<const T*>(args.dy), args.indices,
                                                  static_cast<T*>(args.dx), WindowParams(w, kPack),
                                                  static_cast<Index>(work));
    GE2_CHECK_LAUNCH("pool2d window_backward_kernel");
  };
  dispatch_window<true>(args.dtype, args.mode, w, aligned, launch);
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
