// Candidate streaming: one block per row, any row length and alignment (the path that always works). Pass 1 keeps
// a running (max, sum of exponentials) per thread, rescaling the sum when the max grows (online softmax); pass 2
// re-reads the row (from L2 while the resident rows fit in it) to write the gradient. 16-byte packs when the row
// and pointers allow, scalars otherwise.
#include "kernels/row_common.cuh"

namespace ge2::cross_entropy {
namespace {

constexpr int kThreads = 512;

template <typename T, typename L, int kVec>
__global__ void __launch_bounds__(kThreads) streaming_rows(RowProblem p) {
  __shared__ float reduce_scratch[32];
  const T* logits = static_cast<const T*>(p.logits);
  T* dlogits = static_cast<T*>(p.dlogits);
  const float upstream = uniform_upstream<T>(p);
  float running_loss = 0.0f;

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = logits + row * p.cols;
    const RowLabel label = read_label<T, L>(p, row);
    float thread_max = MaxOp::identity(), thread_sum = 0.0f;
#pragma unroll 4
    for (int64_t col = static_cast<int64_t>(threadIdx.x) * kVec; col < p.cols; col += kThreads * kVec) {
      const Pack<T, kVec> pack = load_pack<T, kVec>(x + col);
      float pack_max = MaxOp::identity();
#pragma unroll
      for (int i = 0; i < kVec; ++i) pack_max = fmaxf(pack_max, to_float(pack.values[i]));
      if (pack_max > thread_max) {
        thread_sum *= exp_shifted(thread_max, pack_max);
        thread_max = pack_max;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) thread_sum += exp_shifted(to_float(pack.values[i]), thread_max);
    }
    const float row_max = block_reduce(thread_max, MaxOp{}, reduce_scratch);
    const float row_sum = block_reduce(thread_sum * exp_shifted(thread_max, row_max), SumOp{}, reduce_scratch);
    const RowOutcome outcome = finish_row<T>(p, row, label, row_max, row_sum, upstream);

    if (dlogits != nullptr) {
      T* g = dlogits + row * p.cols;
#pragma unroll 4
      for (int64_t col = static_cast<int64_t>(threadIdx.x) * kVec; col < p.cols; col += kThreads * kVec) {
        const Pack<T, kVec> pack = load_pack<T, kVec>(x + col);
        Pack<T, kVec> out;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          out.values[i] = from_float<T>(gradient(to_float(pack.values[i]), col + i, row_max, label, outcome));
        }
        store_pack<T, kVec>(g + col, out);
      }
    }
    if (threadIdx.x == 0) record_row<T>(p, row, label, outcome, &running_loss);
  }
  write_block_partial<1>(p, threadIdx.x == 0, 0, running_loss);
}

template <typename T, typename L, int kVec>
int launch(const RowProblem& problem, cudaStream_t stream) {
  const auto kernel = streaming_rows<T, L, kVec>;
  static const int per_sm = blocks_per_sm(kernel, kThreads);
  const int grid = persistent_grid(per_sm, problem.rows);
  kernel<<<grid, kThreads, 0, stream>>>(problem);
  GE2_CHECK_LAUNCH("cross_entropy streaming");
  return grid;
}

}  // namespace

void launch_streaming(const RowProblem& problem, DType dtype, DType label_dtype, bool vectorized, int* grid,
                      cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype", GE2_DISPATCH_INDEX(label_dtype, "labels", {
    *grid = vectorized ? launch<scalar_t, index_t, kPackSize<scalar_t>>(problem, stream)
                       : launch<scalar_t, index_t, 1>(problem, stream);
  }));
}

}  // namespace ge2::cross_entropy
