// The second pass of a split reduction: y[o] = combine(partials[0][o], partials[1][o], ...) in split order (so the
// result does not depend on timing), scaled for mean and stored as the dtype. One thread per output; consecutive
// threads read consecutive partials.
#include "reduce_common.cuh"
#include "status.hpp"

namespace ge2::reduce {
namespace {

constexpr int kThreads = 256;

template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads)
    finalize_partials(const float* __restrict__ partials, T* __restrict__ y, int64_t outputs, int64_t splits,
                      float scale) {
  const Op op;
  for (int64_t out = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; out < outputs;
       out += static_cast<int64_t>(gridDim.x) * kThreads) {
    float total = Op::identity();
    for (int64_t split = 0; split < splits; ++split) total = op(total, partials[split * outputs + out]);
    y[out] = from_float<T>(total * scale);
  }
}

}  // namespace

void launch_finalize_partials(const float* partials, void* y, int64_t outputs, int64_t splits, DType dtype,
                              Reduction reduction, float scale, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype", dispatch_reduction(reduction, [&](auto op) {
    finalize_partials<scalar_t, decltype(op)><<<grid_blocks(outputs, kThreads), kThreads, 0, stream>>>(
        partials, static_cast<scalar_t*>(y), outputs, splits, scale);
  }));
  GE2_CHECK_LAUNCH("reduce finalize_partials");
}

}  // namespace ge2::reduce
