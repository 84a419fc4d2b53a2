// swiglu, variant 2: 16-byte loads and stores (4 float32 or 8 float16/bfloat16 per access), one pack per thread in
// a grid-stride loop: a quarter (float32) or an eighth of the memory instructions of the scalar kernel. Needs
// 16-byte aligned arrays and count a multiple of the pack size (checked by the launcher: no tail loop here).
#include "api.hpp"
#include "float_access.hpp"
#include "status.hpp"
#include "swiglu_math.cuh"

namespace ge2::swiglu {
namespace {

template <typename T, int kPack>
__global__ void forward_vec16(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t packs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    float gate[kPack], up[kPack], out[kPack];
    load_floats<kPack>(a + p * kPack, gate);
    load_floats<kPack>(b + p * kPack, up);
#pragma unroll
    for (int k = 0; k < kPack; ++k) out[k] = swiglu_forward(gate[k], up[k]);
    store_floats<kPack>(y + p * kPack, out);
  }
}

template <typename T, int kPack>
__global__ void backward_vec16(const T* __restrict__ dy, const T* __restrict__ a, const T* __restrict__ b,
                               T* __restrict__ da, T* __restrict__ db, int64_t packs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    float grad_y[kPack], gate[kPack], up[kPack], grad_a[kPack], grad_b[kPack];
    load_floats<kPack>(dy + p * kPack, grad_y);
    load_floats<kPack>(a + p * kPack, gate);
    load_floats<kPack>(b + p * kPack, up);
#pragma unroll
    for (int k = 0; k < kPack; ++k) swiglu_backward(grad_y[k], gate[k], up[k], grad_a[k], grad_b[k]);
    if (da != nullptr) store_floats<kPack>(da + p * kPack, grad_a);
    if (db != nullptr) store_floats<kPack>(db + p * kPack, grad_b);
  }
}

}  // namespace

void launch_forward_vec16(const ForwardArgs& args, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    constexpr int kPack = kPackSize<scalar_t>;
    const int64_t packs = args.count / kPack;
    forward_vec16<scalar_t, kPack><<<blocks_for(packs), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(args.a), static_cast<const scalar_t*>(args.b), static_cast<scalar_t*>(args.y),
        packs);
  });
  GE2_CHECK_LAUNCH("swiglu forward_vec16");
}

void launch_backward_vec16(const BackwardArgs& args, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", {
    constexpr int kPack = kPackSize<scalar_t>;
    const int64_t packs = args.count / kPack;
    backward_vec16<scalar_t, kPack><<<blocks_for(packs), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(args.dy), static_cast<const scalar_t*>(args.a),
        static_cast<const scalar_t*>(args.b), static_cast<scalar_t*>(args.da), static_cast<scalar_t*>(args.db),
        packs);
  });
  GE2_CHECK_LAUNCH("swiglu backward_vec16");
}

}  // namespace ge2::swiglu
