// elementwise backward.
//   unary:  dx = dy * op'(x), one pass (map_vec16, or map_scalar when misaligned).
//   binary: an operand of the output's shape gets its gradient elementwise (both at once when a and b have one
//           shape); a broadcast operand gets it summed over the dims it was broadcast along, computed on the fly
//           from (dy, a, b) inside the reduction, never materialized:
//     colsum_kernel:         [rows, cols] with the operand a row vector (bias-like). Threads run along columns
//                            with 16-byte vectors, blocks split the rows; the other operand's full gradient is
//                            written in the same pass when it has one (bias_add backward is one read of dy).
//     reduce_general_kernel: anything else (column vectors, scalars, [R0, K, R1] patterns): one warp per
//                            (operand element, split of its reduced range), strided index math.
//   Splits write float32 partials to the per-(device, stream) workspace and a finalize kernel sums them, so
//   results are deterministic (no atomics).
#include "kernels/map.cuh"
#include "reduction.hpp"
#include "stream_workspace.hpp"

namespace ge2::elementwise {
namespace {

// Split partials live in the module's per-(device, stream) workspace (_common/stream_workspace.hpp), at most
// this many floats, so a reduction with more outputs than that runs unsplit.
constexpr int64_t kWorkspaceFloats = int64_t{4} << 20;

float* partials(int64_t splits, int64_t outputs, cudaStream_t stream) {
  return static_cast<float*>(StreamWorkspace::get(splits * outputs * sizeof(float), stream));
}

// ---- colsum: gradient of a row-vector operand of [rows, cols] ----------------------------------------------------
constexpr int kColLanes = 32;                         // threadIdx.x: column vectors
constexpr int kRowLanes = kThreads / kColLanes;       // threadIdx.y: rows
constexpr int kRowUnroll = 4;                         // rows loaded before any math

// in = (dy, a, b). GX: the reduced operand's gradient; GY (kFused): the full operand's, stored to y_grad.
// V = kPackSize<T> needs cols % V == 0 and aligned pointers; V = 1 always works.
template <typename T, int V, typename GX, typename GY, bool kFused>
__global__ void __launch_bounds__(kThreads)
    colsum_kernel(Operands2d<T, 3> in, int64_t rows, int64_t cols, int64_t rows_per_split, T* __restrict__ x_grad,
                  float* __restrict__ partial, T* __restrict__ y_grad, GX gx, GY gy) {
  __shared__ float sums[kRowLanes][kColLanes * V];
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColLanes + threadIdx.x) * V;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t row_end = min(rows, row_begin + rows_per_split);
  float acc[V] = {};
  if (col < cols) {
    for (int64_t row0 = row_begin + threadIdx.y; row0 < row_end; row0 += kRowLanes * kRowUnroll) {
      Pack<T, V> values[kRowUnroll][3];  // storage type: half the registers of float32 for 16-bit types
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t row = row0 + u * kRowLanes;
        if (row < row_end) {
#pragma unroll
          for (int i = 0; i < 3; ++i) values[u][i] = load_operand<T, V>(in, i, row, col);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t row = row0 + u * kRowLanes;
        if (row < row_end) {
          Pack<T, V> full;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const float operands[3] = {to_float(values[u][0].values[e]), to_float(values[u][1].values[e]),
                                       to_float(values[u][2].values[e])};
            float g[1];
            gx(operands, g);
            acc[e] += g[0];
            if constexpr (kFused) {
              gy(operands, g);
              full.values[e] = from_float<T>(g[0]);
            }
          }
          if constexpr (kFused) store_pack<T, V>(y_grad + row * cols + col, full);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) sums[threadIdx.y][threadIdx.x * V + e] = acc[e];
  __syncthreads();
  // Each of the block's 256 threads now owns columns of the tile and sums them over the row lanes.
  for (int c = threadIdx.y * kColLanes + threadIdx.x; c < kColLanes * V; c += kThreads) {
    const int64_t out_col = static_cast<int64_t>(blockIdx.x) * kColLanes * V + c;
    if (out_col >= cols) continue;
    float total = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowLanes; ++r) total += sums[r][c];
    if (partial != nullptr) {
      partial[static_cast<int64_t>(blockIdx.y) * cols + out_col] = total;
    } else {
      x_grad[out_col] = from_float<T>(total);
    }
  }
}

// ---- reduce_general: any broadcast pattern -------------------------------------------------------------------------
// The reduced operand's elements are indexed by its kept dims, its reduced range by the dims it was broadcast
// along; strides per dim for dy, a and b.
struct ReduceLayout {
  int kept_ndim = 0, reduced_ndim = 0;
  int64_t kept_extent[kMaxDims] = {}, reduced_extent[kMaxDims] = {};
  int64_t kept_stride[3][kMaxDims] = {}, reduced_stride[3][kMaxDims] = {};
  int64_t outputs = 1, length = 1;
};

constexpr int kWarps = kThreads / 32;

template <typename T, typename G>
__global__ void __launch_bounds__(kThreads)
    reduce_general_kernel(Inputs<T, 3> in, ReduceLayout layout, int64_t length_per_split, T* __restrict__ x_grad,
                          float* __restrict__ partial, G g) {
  const int lane = threadIdx.x % 32;
  const int64_t output = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (output >= layout.outputs) return;  // whole warps leave together
  int64_t base[3] = {};
  int64_t rest = output;
  for (int d = layout.kept_ndim - 1; d >= 0; --d) {
    const int64_t coordinate = rest % layout.kept_extent[d];
    rest /= layout.kept_extent[d];
#pragma unroll
    for (int i = 0; i < 3; ++i) base[i] += coordinate * layout.kept_stride[i][d];
  }
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * length_per_split;
  const int64_t end = min(layout.length, begin + length_per_split);
  float acc = 0.0f;
  for (int64_t r = begin + lane; r < end; r += 32) {
    int64_t offset[3] = {base[0], base[1], base[2]};
    int64_t rest_r = r;
    for (int d = layout.reduced_ndim - 1; d >= 0; --d) {
      const int64_t coordinate = rest_r % layout.reduced_extent[d];
      rest_r /= layout.reduced_extent[d];
#pragma unroll
      for (int i = 0; i < 3; ++i) offset[i] += coordinate * layout.reduced_stride[i][d];
    }
    const float operands[3] = {to_float(in.p[0][offset[0]]), to_float(in.p[1][offset[1]]),
                               to_float(in.p[2][offset[2]])};
    float value[1];
    g(operands, value);
    acc += value[0];
  }
  acc = warp_reduce(acc, SumOp{});
  if (lane == 0) {
    if (partial != nullptr) {
      partial[static_cast<int64_t>(blockIdx.y) * layout.outputs + output] = acc;
    } else {
      x_grad[output] = from_float<T>(acc);
    }
  }
}

// x_grad[o] = sum over splits of partial[s * outputs + o]; one warp per output.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    finalize_kernel(const float* __restrict__ partial, int64_t splits, int64_t outputs, T* __restrict__ x_grad) {
  const int lane = threadIdx.x % 32;
  const int64_t output = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (output >= outputs) return;
  float acc = 0.0f;
  for (int64_t s = lane; s < splits; s += 32) acc += partial[s * outputs + output];
  acc = warp_reduce(acc, SumOp{});
  if (lane == 0) x_grad[output] = from_float<T>(acc);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
void launch_finalize(const float* partial, int64_t splits, int64_t outputs, T* x_grad, cudaStream_t stream) {
  finalize_kernel<T><<<blocks_for(outputs, kWarps), kThreads, 0, stream>>>(partial, splits, outputs, x_grad);
  GE2_CHECK_LAUNCH("elementwise finalize");
}

// ---- launchers ------------------------------------------------------------------------------------------------
template <typename T>
struct Operands {
  const T* dy;
  const T* a;
  const T* b;
};

template <typename T>
Operands2d<T, 3> operands_2d(const Operands<T>& ops, const Broadcast& problem) {
  Operands2d<T, 3> in{{ops.dy, ops.a, ops.b}, {}, {}};
  in.row_stride[0] = problem.ndim == 2 ? problem.cols() : 0;
  in.col_stride[0] = 1;
  strides_2d(problem, problem.stride_a, &in.row_stride[1], &in.col_stride[1]);
  strides_2d(problem, problem.stride_b, &in.row_stride[2], &in.col_stride[2]);
  return in;
}

// Gradient of an operand of the output's shape: rowcol when vectors fit, else strided.
template <typename T, typename G>
void full_grad(const Operands<T>& ops, T* x_grad, const Broadcast& problem, G g, bool aligned, cudaStream_t stream) {
  if (aligned && problem.is_2d() && problem.cols() % kPackSize<T> == 0) {
    launch_map_rowcol<T>(operands_2d(ops, problem), x_grad, problem.rows(), problem.cols(), g, stream);
    return;
  }
  StridedOperands<T, 3> in{{ops.dy, ops.a, ops.b}, {}};
  contiguous_strides(problem, in.stride[0]);
  for (int d = 0; d < problem.ndim; ++d) {
    in.stride[1][d] = problem.stride_a[d];
    in.stride[2][d] = problem.stride_b[d];
  }
  launch_map_strided<T>(in, x_grad, problem, g, stream);
}

// Gradient of a row-vector operand (problem 2-d, operand strides (0, 1)), fused with the other operand's full
// gradient when y_grad is given.
template <typename T, typename GX, typename GY>
void colsum(const Operands<T>& ops, T* x_grad, T* y_grad, const Broadcast& problem, GX gx, GY gy, bool aligned,
            cudaStream_t stream) {
  const int64_t rows = problem.rows(), cols = problem.cols();
  constexpr int P = kPackSize<T>;
  const bool vectorized = aligned && cols % P == 0;
  const int64_t col_blocks = ceil_div(cols, kColLanes * (vectorized ? P : 1));
  int64_t splits = ceil_div(int64_t{kSmCount} * 8, col_blocks);
  splits = std::min({splits, ceil_div(rows, 64), kWorkspaceFloats / cols, int64_t{65535}});
  splits = std::max<int64_t>(splits, 1);
  const int64_t rows_per_split = ceil_div(rows, splits);
  splits = ceil_div(rows, rows_per_split);
  float* partial = splits > 1 ? partials(splits, cols, stream) : nullptr;
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
  const dim3 block(kColLanes, kRowLanes);
  const auto in = operands_2d(ops, problem);
  if (vectorized) {
    if (y_grad != nullptr) {
      colsum_kernel<T, P, GX, GY, true><<<grid, block, 0, stream>>>(in, rows, cols, rows_per_split, x_grad, partial,
                                                                    y_grad, gx, gy);
    } else {
      colsum_kernel<T, P, GX, GY, false><<<grid, block, 0, stream>>>(in, rows, cols, rows_per_split, x_grad,
                                                                     partial, nullptr, gx, gy);
    }
  } else {
    if (y_grad != nullptr) {
      colsum_kernel<T, 1, GX, GY, true><<<grid, block, 0, stream>>>(in, rows, cols, rows_per_split, x_grad, partial,
                                                                    y_grad, gx, gy);
    } else {
      colsum_kernel<T, 1, GX, GY, false><<<grid, block, 0, stream>>>(in, rows, cols, rows_per_split, x_grad,
                                                                     partial, nullptr, gx, gy);
    }
  }
  GE2_CHECK_LAUNCH("elementwise colsum");
  if (partial != nullptr) launch_finalize<T>(partial, splits, cols, x_grad, stream);
}

template <typename T, typename G>
void reduce_general(const Operands<T>& ops, T* x_grad, const Broadcast& problem, int operand, G g,
                    cudaStream_t stream) {
  const int64_t* x_stride = operand == 0 ? problem.stride_a : problem.stride_b;
  int64_t dy_stride[kMaxDims] = {};
  contiguous_strides(problem, dy_stride);
  ReduceLayout layout;
  for (int d = 0; d < problem.ndim; ++d) {
    const int64_t strides[3] = {dy_stride[d], problem.stride_a[d], problem.stride_b[d]};
    if (x_stride[d] != 0) {
      layout.kept_extent[layout.kept_ndim] = problem.shape[d];
      for (int i = 0; i < 3; ++i) layout.kept_stride[i][layout.kept_ndim] = strides[i];
      ++layout.kept_ndim;
      layout.outputs *= problem.shape[d];
    } else {
      layout.reduced_extent[layout.reduced_ndim] = problem.shape[d];
      for (int i = 0; i < 3; ++i) layout.reduced_stride[i][layout.reduced_ndim] = strides[i];
      ++layout.reduced_ndim;
      layout.length *= problem.shape[d];
    }
  }
  int64_t splits = ceil_div(int64_t{kSmCount} * 64, layout.outputs);
  splits = std::min({splits, ceil_div(layout.length, 1024), kWorkspaceFloats / layout.outputs, int64_t{65535}});
  splits = std::max<int64_t>(splits, 1);
  const int64_t per_split = ceil_div(layout.length, splits);
  splits = ceil_div(layout.length, per_split);
  float* partial = splits > 1 ? partials(splits, layout.outputs, stream) : nullptr;
  const dim3 grid(static_cast<unsigned>(ceil_div(layout.outputs, kWarps)), static_cast<unsigned>(splits));
  reduce_general_kernel<T, G><<<grid, kThreads, 0, stream>>>(Inputs<T, 3>{{ops.dy, ops.a, ops.b}}, layout, per_split,
                                                             x_grad, partial, g);
  GE2_CHECK_LAUNCH("elementwise reduce_general");
  if (partial != nullptr) launch_finalize<T>(partial, splits, layout.outputs, x_grad, stream);
}

template <typename T, BinaryOp Op>
void binary_backward_typed(const Operands<T>& ops, T* da, T* db, const Broadcast& problem, cudaStream_t stream) {
  const BinaryGrad<Op, 0> grad_a;
  const BinaryGrad<Op, 1> grad_b;
  const bool aligned = aligned16(ops.dy) && aligned16(ops.a) && aligned16(ops.b) && aligned16(da) && aligned16(db);
  if (problem.same_shape()) {
    if (da != nullptr && db != nullptr) {
      using Both = BinaryGradBoth<Op>;
      Inputs<T, Both::kIn> in{};
      in.p[0] = ops.dy;
      if constexpr (Both::kIn == 3) {
        in.p[1] = ops.a;
        in.p[2] = ops.b;
      }
      const Outputs<T, 2> out{{da, db}};
      aligned ? launch_map_vec16<T>(in, out, problem.numel, Both{}, stream)
              : launch_map_scalar<T>(in, out, problem.numel, Both{}, stream);
      return;
    }
    const Inputs<T, 3> in{{ops.dy, ops.a, ops.b}};
    if (da != nullptr) {
      aligned ? launch_map_vec16<T>(in, Outputs<T, 1>{{da}}, problem.numel, grad_a, stream)
              : launch_map_scalar<T>(in, Outputs<T, 1>{{da}}, problem.numel, grad_a, stream);
    }
    if (db != nullptr) {
      aligned ? launch_map_vec16<T>(in, Outputs<T, 1>{{db}}, problem.numel, grad_b, stream)
              : launch_map_scalar<T>(in, Outputs<T, 1>{{db}}, problem.numel, grad_b, stream);
    }
    return;
  }
  const bool a_full = problem.numel_a == problem.numel, b_full = problem.numel_b == problem.numel;
  // A row-vector operand of a 2-d problem: colsum, carrying the other operand's full gradient along.
  auto is_row_vector = [&](const int64_t* stride) {
    return problem.ndim == 2 && stride[0] == 0 && stride[1] == 1;
  };
  bool a_done = da == nullptr, b_done = db == nullptr;
  if (!a_done && is_row_vector(problem.stride_a)) {
    T* fused = (!b_done && b_full) ? db : nullptr;
    colsum<T>(ops, da, fused, problem, grad_a, grad_b, aligned, stream);
    a_done = true;
    b_done = b_done || fused != nullptr;
  }
  if (!b_done && is_row_vector(problem.stride_b)) {
    T* fused = (!a_done && a_full) ? da : nullptr;
    colsum<T>(ops, db, fused, problem, grad_b, grad_a, aligned, stream);
    b_done = true;
    a_done = a_done || fused != nullptr;
  }
  if (!a_done) {
    a_full ? full_grad<T>(ops, da, problem, grad_a, aligned, stream)
           : reduce_general<T>(ops, da, problem, 0, grad_a, stream);
  }
  if (!b_done) {
    b_full ? full_grad<T>(ops, db, problem, grad_b, aligned, stream)
           : reduce_general<T>(ops, db, problem, 1, grad_b, stream);
  }
}

}  // namespace

void unary_backward(UnaryOp op, const void* dy, const void* x, void* dx, int64_t numel, DType dtype,
                    cudaStream_t stream) {
  if (!is_floating(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") + dtype_name(dtype));
  }
  if (numel < 0) throw std::invalid_argument("numel: expected >= 0, got " + std::to_string(numel));
  if (numel == 0) return;
  if (dy == nullptr) throw std::invalid_argument("dy: null device pointer");
  if (x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (dx == nullptr) throw std::invalid_argument("dx: null device pointer");
  const bool aligned = aligned16(dy) && aligned16(x) && aligned16(dx);
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    const Inputs<scalar_t, 2> in{{static_cast<const scalar_t*>(dy), static_cast<const scalar_t*>(x)}};
    const Outputs<scalar_t, 1> out{{static_cast<scalar_t*>(dx)}};
    GE2_DISPATCH_UNARY(op, {
      aligned ? launch_map_vec16<scalar_t>(in, out, numel, UnaryBackward<kOp>{}, stream)
              : launch_map_scalar<scalar_t>(in, out, numel, UnaryBackward<kOp>{}, stream);
    });
  });
}

void binary_backward(BinaryOp op, const void* dy, const void* a, const void* b, void* da, void* db,
                     const Broadcast& problem, DType dtype, cudaStream_t stream) {
  if (!is_floating(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") + dtype_name(dtype));
  }
  if (da == nullptr && db == nullptr) return;
  const std::size_t bytes = dtype_size(dtype);
  if (problem.numel == 0) {  // an empty sum is zero
    if (da != nullptr && problem.numel_a > 0) GE2_CUDA_CHECK(cudaMemsetAsync(da, 0, problem.numel_a * bytes, stream));
    if (db != nullptr && problem.numel_b > 0) GE2_CUDA_CHECK(cudaMemsetAsync(db, 0, problem.numel_b * bytes, stream));
    return;
  }
  if (dy == nullptr) throw std::invalid_argument("dy: null device pointer");
  if (a == nullptr) throw std::invalid_argument("a: null device pointer");
  if (b == nullptr) throw std::invalid_argument("b: null device pointer");
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    const Operands<scalar_t> ops{static_cast<const scalar_t*>(dy), static_cast<const scalar_t*>(a),
                                 static_cast<const scalar_t*>(b)};
    GE2_DISPATCH_BINARY(op, binary_backward_typed<scalar_t, kOp>(ops, static_cast<scalar_t*>(da),
                                                                 static_cast<scalar_t*>(db), problem, stream));
  });
}

}  // namespace ge2::elementwise
