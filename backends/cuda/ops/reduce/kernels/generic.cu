// Kernel 4, generic: any set of reduced axes, e.g. [reduced, kept, reduced] that neither Rows nor Columns
// describe. A warp per output: the output index maps to the x offset of its first element through the kept dims,
// and each lane walks every 32nd reduced multi-index through the reduced dims (integer division per dim: slow,
// but it runs every problem, and it is the independent check on the fast kernels). Deterministic: fixed lane
// order, fixed shuffle tree.
#include "reduce_common.cuh"
#include "status.hpp"

namespace ge2::reduce {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads)
    generic_reduce(const T* __restrict__ x, T* __restrict__ y, GenericMaps maps, int64_t outputs, int64_t count,
                   float scale) {
  const Op op;
  const int lane = threadIdx.x % 32;
  // `out` is the same for all lanes of a warp, so the shuffles see the whole warp.
  for (int64_t out = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; out < outputs;
       out += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* first = x + maps.kept.offset_of(out);
    float acc = Op::identity();
    for (int64_t r = lane; r < count; r += 32) acc = op(acc, to_float(first[maps.reduced.offset_of(r)]));
    acc = warp_reduce(acc, op);
    if (lane == 0) y[out] = from_float<T>(acc * scale);
  }
}

}  // namespace

void launch_generic(const ForwardArgs& args, cudaStream_t stream) {
  const Layout& layout = args.layout;
  const GenericMaps maps = generic_maps(layout);
  const float scale = output_scale(args.reduction, layout.count);
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", dispatch_reduction(args.reduction, [&](auto op) {
    generic_reduce<scalar_t, decltype(op)><<<grid_blocks(layout.outputs, kWarpsPerBlock), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(args.x), static_cast<scalar_t*>(args.y), maps, layout.outputs, layout.count,
        scale);
  }));
  GE2_CHECK_LAUNCH("reduce generic");
}

}  // namespace ge2::reduce
