// What the pooling kernels share: launch sizing and the per-launch window constants.
#pragma once
#include <algorithm>
#include <cstdint>

#include "../api.hpp"
#include "fast_divmod.hpp"
#include "offset_index.hpp"
#include "storage_dispatch.hpp"
#include "status.hpp"

namespace ge2::pool2d {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 32;  // H100 SMs x resident blocks; grid-stride loops cover the rest

inline int grid_for(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// Calls launch(TypeTag<T>, Constant<kPack>, Constant<kMax>, Constant<kChannelsLast>, Index{}) for a windowed
// problem: T the storage type, kPack the NHWC channel vector (1 for NCHW, where a thread's taps are spread over a
// plane rather than contiguous), Index the offset type. `aligned`: the vectorized pointers are 16-byte aligned.
template <typename Launch>
void dispatch_window(DType dtype, Mode mode, const Window& w, bool aligned, Launch&& launch) {
  const bool channels_last = w.layout == Layout::NHWC;
  const int64_t largest = w.batch * w.channels * std::max(w.height * w.width, w.out_height * w.out_width);
  dispatch_storage(dtype, channels_last ? w.channels : 1, aligned && channels_last, [&](auto tag, auto width) {
    dispatch_offset_index(largest, [&](auto index) {
      const auto in_layout = [&](auto max) {
        if (channels_last) {
          launch(tag, width, max, Constant<1>{}, index);
        } else {
          launch(tag, Constant<1>{}, max, Constant<0>{}, index);
        }
      };
      if (mode == Mode::Max) {
        in_layout(Constant<1>{});
      } else {
        in_layout(Constant<0>{});
      }
    });
  });
}

// The window constants of one launch, with divisors for the index decomposition. `packs` is the number of
// kPack-channel groups per position (NHWC) or 1 (NCHW, one element per thread).
struct WindowParams {
  int64_t channels, height, width, out_height, out_width;
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  bool count_include_pad;
  FastDivmod channel_packs, out_w_div, out_h_div, in_w_div, in_h_div;

  WindowParams(const Window& w, int pack)
      : channels(w.channels), height(w.height), width(w.width), out_height(w.out_height), out_width(w.out_width),
        kernel_h(w.kernel_h), kernel_w(w.kernel_w), stride_h(w.stride_h), stride_w(w.stride_w), pad_h(w.pad_h),
        pad_w(w.pad_w), dilation_h(w.dilation_h), dilation_w(w.dilation_w), count_include_pad(w.count_include_pad),
        channel_packs(w.channels / pack), out_w_div(w.out_width), out_h_div(w.out_height), in_w_div(w.width),
        in_h_div(w.height) {}
};

// avg_pool2d's divisor for the window of output (oh, ow), as PyTorch computes it: the window clipped to the padded
// input, then (count_include_pad false) to the input itself.
__device__ __forceinline__ float avg_divisor(const WindowParams& p, int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  int64_t h1 = min(h0 + p.kernel_h, p.height + p.pad_h), w1 = min(w0 + p.kernel_w, p.width + p.pad_w);
  if (!p.count_include_pad) {
    h0 = max(h0, int64_t{0});
    w0 = max(w0, int64_t{0});
    h1 = min(h1, p.height);
    w1 = min(w1, p.width);
  }
  return static_cast<float>((h1 - h0) * (w1 - w0));
}

}  // namespace ge2::pool2d
