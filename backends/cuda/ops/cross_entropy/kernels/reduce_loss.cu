// The small kernels around the row kernels for "sum" and "mean":
//   count_labels: per-block counts of non-ignored labels ("mean" divides by their total; the row kernels need it
//                 before they write gradients, so it runs first).
//   finalize:     one block adds the row kernel's per-block partial losses in a fixed order (deterministic: no
//                 float atomics) and divides by the count for "mean" (0 / 0 = NaN when every label is ignored).
#include "kernels/row_common.cuh"

namespace ge2::cross_entropy {
namespace {

constexpr int kCountThreads = 256;
constexpr int64_t kLabelsPerCountBlock = 8192;

__device__ __forceinline__ long long warp_sum(long long value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

template <typename L>
__global__ void __launch_bounds__(kCountThreads) count_labels(const L* __restrict__ labels, int64_t rows,
                                                              int64_t ignore_index, long long* partial_counts) {
  __shared__ long long warp_counts[kCountThreads / 32];
  long long count = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCountThreads + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * kCountThreads) {
    count += static_cast<int64_t>(labels[i]) != ignore_index;
  }
  count = warp_sum(count);
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long total = 0;
#pragma unroll
    for (int w = 0; w < kCountThreads / 32; ++w) total += warp_counts[w];
    partial_counts[blockIdx.x] = total;
  }
}

constexpr int kFinalizeThreads = 1024;

template <typename T>
__global__ void __launch_bounds__(kFinalizeThreads) finalize(const float* __restrict__ partial_loss, int row_blocks,
                                                             const long long* __restrict__ partial_counts,
                                                             int count_blocks, Reduction reduction, T* loss) {
  __shared__ float reduce_scratch[32];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < row_blocks; i += kFinalizeThreads) sum += partial_loss[i];
  const float total = block_reduce(sum, SumOp{}, reduce_scratch);
  if (threadIdx.x == 0) {
    float result = total;
    if (reduction == Reduction::Mean) {
      long long count = 0;
      for (int i = 0; i < count_blocks; ++i) count += partial_counts[i];
      result = total / static_cast<float>(count);
    }
    loss[0] = from_float<T>(result);
  }
}

}  // namespace

int launch_count_labels(const void* labels, DType label_dtype, int64_t rows, int64_t ignore_index,
                        long long* partial_counts, cudaStream_t stream) {
  if (rows == 0) return 0;
  const int blocks = static_cast<int>(
      std::min<int64_t>(kMaxCountBlocks, (rows + kLabelsPerCountBlock - 1) / kLabelsPerCountBlock));
  GE2_DISPATCH_INDEX(label_dtype, "labels",
                     count_labels<index_t><<<blocks, kCountThreads, 0, stream>>>(
                         static_cast<const index_t*>(labels), rows, ignore_index, partial_counts));
  GE2_CHECK_LAUNCH("cross_entropy count_labels");
  return blocks;
}

void launch_finalize(const float* partial_loss, int row_blocks, const long long* partial_counts, int count_blocks,
                     Reduction reduction, void* loss, DType dtype, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype",
                        finalize<scalar_t><<<1, kFinalizeThreads, 0, stream>>>(
                            partial_loss, row_blocks, partial_counts, count_blocks, reduction,
                            static_cast<scalar_t*>(loss)));
  GE2_CHECK_LAUNCH("cross_entropy finalize");
}

}  // namespace ge2::cross_entropy
