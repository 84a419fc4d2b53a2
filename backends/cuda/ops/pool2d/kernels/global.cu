// global_avg_pool forward. NCHW: each (n, c) plane is a contiguous row, one warp per row. NHWC: [batch, spatial,
// channels], a block of (channel lanes x spatial rows) per tile of channels of one image, each thread summing a
// kPack-channel vector over its rows, then the rows added up in shared memory in a fixed order.
#include "dtype.hpp"
#include "float_access.hpp"
#include "pool_common.cuh"
#include "reduction.hpp"
#include "storage_dispatch.hpp"

namespace ge2::pool2d {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

template <typename T, int kPack>
__global__ void global_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t spatial) {
  const int lane = threadIdx.x % 32;
  const float scale = 1.0f / static_cast<float>(spatial);
  for (int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kWarpsPerBlock) {
    const T* source = x + row * spatial;
    float sum = 0.0f;
    for (int64_t i = int64_t{lane} * kPack; i < spatial; i += 32 * kPack) {
      float values[kPack];
      load_floats<kPack>(source + i, values);
#pragma unroll
      for (int k = 0; k < kPack; ++k) sum += values[k];
    }
    sum = warp_reduce(sum, SumOp{});
    if (lane == 0) y[row] = from_float<T>(sum * scale);
  }
}

// blockDim = (lanes, kThreads / lanes): x over the channel vectors of a tile, y over spatial rows.
template <typename T, int kPack>
__global__ void global_channels_last_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t channels,
                                            int64_t spatial, int64_t tiles) {
  extern __shared__ float partial[];  // [blockDim.y][blockDim.x * kPack]
  const int64_t n = blockIdx.x / tiles;
  const int64_t channel = ((blockIdx.x % tiles) * int64_t{blockDim.x} + threadIdx.x) * kPack;
  float sum[kPack] = {};
  if (channel < channels) {
    const T* source = x + n * spatial * channels + channel;
    for (int64_t s = threadIdx.y; s < spatial; s += blockDim.y) {
      float values[kPack];
      load_floats<kPack>(source + s * channels, values);
#pragma unroll
      for (int k = 0; k < kPack; ++k) sum[k] += values[k];
    }
  }
  const int row_width = blockDim.x * kPack;
#pragma unroll
  for (int k = 0; k < kPack; ++k) partial[threadIdx.y * row_width + threadIdx.x * kPack + k] = sum[k];
  __syncthreads();
  if (threadIdx.y == 0 && channel < channels) {
    float total[kPack] = {};
    for (int r = 0; r < static_cast<int>(blockDim.y); ++r) {
#pragma unroll
      for (int k = 0; k < kPack; ++k) total[k] += partial[r * row_width + threadIdx.x * kPack + k];
    }
    const float scale = 1.0f / static_cast<float>(spatial);
#pragma unroll
    for (int k = 0; k < kPack; ++k) total[k] *= scale;
    store_floats<kPack>(y + n * channels + channel, total);
  }
}

}  // namespace

void launch_global_forward(const GlobalArgs& args, cudaStream_t stream) {
  const bool aligned = is_aligned(args.input, 16) && is_aligned(args.output, 16);
  if (args.layout == Layout::NCHW) {
    const int64_t rows = args.batch * args.channels;
    // Vector loads need every row start aligned: spatial a multiple of the vector width.
    dispatch_storage(args.dtype, args.spatial, is_aligned(args.input, 16), [&](auto tag, auto width) {
      using T = typename decltype(tag)::type;
      const int blocks = static_cast<int>(std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1,
                                                              kMaxBlocks));
      global_rows_kernel<T, decltype(width)::value><<<blocks, kThreads, 0, stream>>>(
          static_cast<const T*>(args.input), static_cast<T*>(args.output), rows, args.spatial);
      GE2_CHECK_LAUNCH("pool2d global_rows_kernel");
    });
    return;
  }
  dispatch_storage(args.dtype, args.channels, aligned, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int kPack = decltype(width)::value;
    const int64_t vectors = args.channels / kPack;
    int lanes = 1;
    while (lanes < 32 && lanes < vectors) lanes *= 2;
    const dim3 block(lanes, kThreads / lanes);
    const int64_t tiles = (vectors + lanes - 1) / lanes;
    const std::size_t shared = sizeof(float) * kThreads * kPack;
    global_channels_last_kernel<T, kPack><<<static_cast<unsigned>(tiles * args.batch), block, shared, stream>>>(
        static_cast<const T*>(args.input), static_cast<T*>(args.output), args.channels, args.spatial, tiles);
    GE2_CHECK_LAUNCH("pool2d global_channels_last_kernel");
  });
}

}  // namespace ge2::pool2d
