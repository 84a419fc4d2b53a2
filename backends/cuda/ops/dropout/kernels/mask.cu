// Candidates vec16 and scalar. Both compute one Philox call per group of 4 consecutive elements (element e =
// offset + i belongs to group e / 4 and uses word e % 4), so their masks are identical.
//   vec16:  a thread per 16-byte pack (1 group for float32, 2 for float16/bfloat16); needs offset % 4 == 0 so that
//           packs start on group boundaries, and 16-byte aligned x and y. The last count % pack elements go one by
//           one.
//   scalar: a thread per group, element by element: any offset, any alignment (the path that always works).
// x and y may be the same array (in place): every element is read and written by the same thread.
#include <algorithm>

#include "api.hpp"
#include "philox.cuh"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::dropout {
namespace {

constexpr int kThreads = 256;

// x * mask / (1 - p) as x * (kept ? scale : 0): a NaN or infinite x stays NaN when dropped, as in the reference.
__device__ __forceinline__ float masked(float x, uint32_t word, uint64_t threshold, float scale) {
  return x * (static_cast<uint64_t>(word) < threshold ? scale : 0.0f);
}

template <typename T>
__device__ __forceinline__ void mask_one(const T* x, T* y, int64_t i, uint64_t offset, uint64_t seed,
                                         uint64_t threshold, float scale) {
  const uint64_t element = offset + static_cast<uint64_t>(i);
  const PhiloxWords words = dropout_words(element >> 2, seed);
  y[i] = from_float<T>(masked(to_float(x[i]), words.w[element & 3], threshold, scale));
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 8) dropout_vec16(const T* x, T* y, int64_t count, uint64_t offset,
                                                          uint64_t seed, uint64_t threshold, float scale) {
  constexpr int kVec = kPackSize<T>, kGroups = kVec / 4;
  const int64_t packs = count / kVec;
  const uint64_t first_group = offset >> 2;
  for (int64_t pack = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; pack < packs;
       pack += static_cast<int64_t>(gridDim.x) * kThreads) {
    const Pack<T, kVec> in = load_pack<T, kVec>(x + pack * kVec);
    Pack<T, kVec> out;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const PhiloxWords words = dropout_words(first_group + static_cast<uint64_t>(pack) * kGroups + g, seed);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out.values[g * 4 + j] = from_float<T>(masked(to_float(in.values[g * 4 + j]), words.w[j], threshold, scale));
      }
    }
    store_pack<T, kVec>(y + pack * kVec, out);
  }
  if (blockIdx.x == 0 && threadIdx.x < count - packs * kVec) {
    mask_one(x, y, packs * kVec + threadIdx.x, offset, seed, threshold, scale);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) dropout_scalar(const T* x, T* y, int64_t count, uint64_t offset,
                                                           uint64_t seed, uint64_t threshold, float scale) {
  const uint64_t first_group = offset >> 2, last_group = (offset + static_cast<uint64_t>(count) - 1) >> 2;
  const uint64_t end = offset + static_cast<uint64_t>(count);  // wraps to 0 only when the last element is 2^64 - 1
  for (uint64_t group = first_group + static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
       group <= last_group; group += static_cast<uint64_t>(gridDim.x) * kThreads) {
    const PhiloxWords words = dropout_words(group, seed);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t element = group * 4 + j;
      if (element < offset || (end != 0 && element >= end)) continue;
      const int64_t i = static_cast<int64_t>(element - offset);
      y[i] = from_float<T>(masked(to_float(x[i]), words.w[j], threshold, scale));
    }
  }
}

int grid_for(int64_t work) {
  int device = 0, sms = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, sms * 16)));
}

}  // namespace

void launch_vec16(const Args& args, uint64_t threshold, float scale, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    const int grid = grid_for(args.count / kPackSize<scalar_t>);
    dropout_vec16<scalar_t><<<grid, kThreads, 0, stream>>>(static_cast<const scalar_t*>(args.x),
                                                           static_cast<scalar_t*>(args.y), args.count, args.offset,
                                                           args.seed, threshold, scale);
  });
  GE2_CHECK_LAUNCH("dropout vec16");
}

void launch_scalar(const Args& args, uint64_t threshold, float scale, cudaStream_t stream) {
  const int64_t groups = static_cast<int64_t>(((args.offset + static_cast<uint64_t>(args.count) - 1) >> 2) -
                                              (args.offset >> 2)) + 1;
  GE2_DISPATCH_FLOATING(args.dtype, "dtype",
                        dropout_scalar<scalar_t><<<grid_for(groups), kThreads, 0, stream>>>(
                            static_cast<const scalar_t*>(args.x), static_cast<scalar_t*>(args.y), args.count,
                            args.offset, args.seed, threshold, scale));
  GE2_CHECK_LAUNCH("dropout scalar");
}

}  // namespace ge2::dropout
