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
// problem: T the storage type, Index the offset type, kPack the values a thread handles: NHWC, that many channels
// of one position; NCHW, that many consecutive columns of one row if kGroupNchwColumns (the backward), else 1.
// kPack is the 16-byte width when the channels (NHWC) or the width (NCHW) are a multiple of it and `aligned` says
// the vectorized pointers are 16-byte aligned, 1 otherwise.
template <bool kGroupNchwColumns, typename Launch>
void dispatch_window(DType dtype, Mode mode, const Window& w, bool aligned, Launch&& launch) {
  const bool channels_last = w.layout == Layout::NHWC;
  const int64_t largest = w.batch * w.channels * std::max(w.height * w.width, w.out_height * w.out_width);
  dispatch_storage(dtype, channels_last ? w.channels : w.width, aligned, [&](auto tag, auto width) {
    dispatch_offset_index(largest, [&](auto index) {
      const auto in_layout = [&](auto max) {
        if (channels_last) {
          launch(tag, width, max, Constant<1>{}, index);
        } else if constexpr (kGroupNchwColumns) {
          launch(tag, width, max, Constant<0>{}, index);
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

// The window constants of one launch, with divisors for the index decomposition. `pack` is the kPack of the launch:
// channels per thread (NHWC) or consecutive input columns per thread (NCHW backward; 1 for the NCHW forward). Sizes
// are int: H * W < 2^31 is checked before launch, so every coordinate and plane index fits.
struct WindowParams {
  int64_t channels;
  int height, width, out_height, out_width;
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  bool count_include_pad;
  FastDivmod channel_packs, out_w_div, out_h_div, in_w_groups, in_h_div;

  WindowParams(const Window& w, int pack)
      : channels(w.channels), height(static_cast<int>(w.height)), width(static_cast<int>(w.width)),
        out_height(static_cast<int>(w.out_height)), out_width(static_cast<int>(w.out_width)), kernel_h(w.kernel_h),
        kernel_w(w.kernel_w), stride_h(w.stride_h), stride_w(w.stride_w), pad_h(w.pad_h), pad_w(w.pad_w),
        dilation_h(w.dilation_h), dilation_w(w.dilation_w), count_include_pad(w.count_include_pad),
        channel_packs(w.channels / pack), out_w_div(w.out_width), out_h_div(w.out_height),
        in_w_groups(w.layout == Layout::NHWC ? w.width : w.width / pack), in_h_div(w.height) {}
};

// avg_pool2d's divisor for the window of output (oh, ow), as PyTorch computes it: the window clipped to the padded
// input, then (count_include_pad false) to the input itself.
__device__ __forceinline__ float avg_divisor(const WindowParams& p, int oh, int ow) {
  int h0 = oh * p.stride_h - p.pad_h, w0 = ow * p.stride_w - p.pad_w;
  int h1 = min(h0 + p.kernel_h, p.height + p.pad_h), w1 = min(w0 + p.kernel_w, p.width + p.pad_w);
  if (!p.count_include_pad) {
    h0 = max(h0, 0);
    w0 = max(w0, 0);
    h1 = min(h1, p.height);
    w1 = min(w1, p.width);
  }
  return static_cast<float>((h1 - h0) * (w1 - w0));
}

// kPack int32 argmax indices of one output position (NHWC, laid out as the channels): 16-byte accesses when kPack is
// a multiple of 4 (the offsets are then multiples of kPack elements of a 16-byte aligned array), scalars otherwise.
template <int kPack>
__device__ __forceinline__ void load_indices(const int32_t* source, int32_t* values) {
  constexpr int kChunk = kPack % 4 == 0 ? 4 : 1;
#pragma unroll
  for (int i = 0; i < kPack; i += kChunk) {
    const Pack<int32_t, kChunk> pack = load_pack<int32_t, kChunk>(source + i);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) values[i + j] = pack.values[j];
  }
}

template <int kPack>
__device__ __forceinline__ void store_indices(int32_t* destination, const int32_t* values) {
  constexpr int kChunk = kPack % 4 == 0 ? 4 : 1;
#pragma unroll
  for (int i = 0; i < kPack; i += kChunk) {
    Pack<int32_t, kChunk> pack;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) pack.values[j] = values[i + j];
    store_pack<int32_t, kChunk>(destination + i, pack);
  }
}

}  // namespace ge2::pool2d
