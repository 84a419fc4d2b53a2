// Forward unary ops y = op(x): the vec16 candidate and the element-by-element one ("strided") for any alignment.
#include "kernels/map.cuh"

namespace ge2::elementwise {

void launch_unary_vec16(UnaryOp op, const void* x, void* y, int64_t numel, DType dtype, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    const auto* in = static_cast<const scalar_t*>(x);
    auto* out = static_cast<scalar_t*>(y);
    GE2_DISPATCH_UNARY(op, launch_map_vec16<scalar_t>(Inputs<scalar_t, 1>{{in}}, Outputs<scalar_t, 1>{{out}}, numel,
                                                      UnaryForward<kOp>{}, stream));
  });
}

void launch_unary_scalar(UnaryOp op, const void* x, void* y, int64_t numel, DType dtype, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    const auto* in = static_cast<const scalar_t*>(x);
    auto* out = static_cast<scalar_t*>(y);
    GE2_DISPATCH_UNARY(op, launch_map_scalar<scalar_t>(Inputs<scalar_t, 1>{{in}}, Outputs<scalar_t, 1>{{out}},
                                                       numel, UnaryForward<kOp>{}, stream));
  });
}

}  // namespace ge2::elementwise
