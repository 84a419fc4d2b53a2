// swiglu, variant 1: one element per thread in a grid-stride loop. Any size, any alignment: the path that always
// works.
#include "api.hpp"
#include "status.hpp"
#include "swiglu_math.cuh"

namespace ge2::swiglu {
namespace {

template <typename T>
__global__ void forward_scalar(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    y[i] = from_float<T>(swiglu_forward(to_float(a[i]), to_float(b[i])));
  }
}

template <typename T>
__global__ void backward_scalar(const T* __restrict__ dy, const T* __restrict__ a, const T* __restrict__ b,
                                T* __restrict__ da, T* __restrict__ db, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float grad_a, grad_b;
    swiglu_backward(to_float(dy[i]), to_float(a[i]), to_float(b[i]), grad_a, grad_b);
    if (da != nullptr) da[i] = from_float<T>(grad_a);
    if (db != nullptr) db[i] = from_float<T>(grad_b);
  }
}

}  // namespace

void launch_forward_scalar(const ForwardArgs& args, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    forward_scalar<scalar_t><<<blocks_for(args.count), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(args.a), static_cast<const scalar_t*>(args.b), static_cast<scalar_t*>(args.y),
        args.count);
  });
  GE2_CHECK_LAUNCH("swiglu forward_scalar");
}

void launch_backward_scalar(const BackwardArgs& args, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    backward_scalar<scalar_t><<<blocks_for(args.count), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(args.dy), static_cast<const scalar_t*>(args.a),
        static_cast<const scalar_t*>(args.b), static_cast<scalar_t*>(args.da), static_cast<scalar_t*>(args.db),
        args.count);
  });
  GE2_CHECK_LAUNCH("swiglu backward_scalar");
}

}  // namespace ge2::swiglu
