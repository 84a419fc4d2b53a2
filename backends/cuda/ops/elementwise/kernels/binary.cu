// Forward binary ops y = a (op) b: the vec16, rowcol and strided candidates.
#include "kernels/map.cuh"

namespace ge2::elementwise {
namespace {

template <typename T>
void binary_vec16_typed(BinaryOp op, const T* a, const T* b, T* y, int64_t numel, cudaStream_t stream) {
  GE2_DISPATCH_BINARY(op, launch_map_vec16<T>(Inputs<T, 2>{{a, b}}, Outputs<T, 1>{{y}}, numel,
                                              BinaryForward<kOp>{}, stream));
}

template <typename T>
void binary_rowcol_typed(BinaryOp op, const T* a, const T* b, T* y, const Broadcast& problem, cudaStream_t stream) {
  Operands2d<T, 2> in{{a, b}, {}, {}};
  strides_2d(problem, problem.stride_a, &in.row_stride[0], &in.col_stride[0]);
  strides_2d(problem, problem.stride_b, &in.row_stride[1], &in.col_stride[1]);
  GE2_DISPATCH_BINARY(op, launch_map_rowcol<T>(in, y, problem.rows(), problem.cols(), BinaryForward<kOp>{}, stream));
}

template <typename T>
void binary_strided_typed(BinaryOp op, const T* a, const T* b, T* y, const Broadcast& problem,
                          cudaStream_t stream) {
  StridedOperands<T, 2> in{{a, b}, {}};
  for (int d = 0; d < problem.ndim; ++d) {
    in.stride[0][d] = problem.stride_a[d];
    in.stride[1][d] = problem.stride_b[d];
  }
  GE2_DISPATCH_BINARY(op, launch_map_strided<T>(in, y, problem, BinaryForward<kOp>{}, stream));
}

}  // namespace

void launch_binary_vec16(BinaryOp op, const void* a, const void* b, void* y, int64_t numel, DType dtype,
                         cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype",
                        binary_vec16_typed<scalar_t>(op, static_cast<const scalar_t*>(a),
                                                     static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y),
                                                     numel, stream));
}

void launch_binary_rowcol(BinaryOp op, const void* a, const void* b, void* y, const Broadcast& problem, DType dtype,
                          cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype",
                        binary_rowcol_typed<scalar_t>(op, static_cast<const scalar_t*>(a),
                                                      static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y),
                                                      problem, stream));
}

void launch_binary_strided(BinaryOp op, const void* a, const void* b, void* y, const Broadcast& problem,
                           DType dtype, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype",
                        binary_strided_typed<scalar_t>(op, static_cast<const scalar_t*>(a),
                                                       static_cast<const scalar_t*>(b), static_cast<scalar_t*>(y),
                                                       problem, stream));
}

}  // namespace ge2::elementwise
