// rowwise: a warp per row, lane l holding elements l, l + 32, ... of a head_dim row in registers (kPer of them). The
// optional additive bias is read per score (bias_at).
// Forward and dQ walk one query row's visible keys with an online softmax; dK/dV walk one key row's visible
// queries over every query head of its group, so each gradient element has one writer (no atomics).
#include <cmath>
#include <type_traits>

#include "api.hpp"
#include "status.hpp"

namespace ge2::attention {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Element offset of row `row` of head `head` in batch `b`, in either layout.
__device__ __forceinline__ int64_t row_offset(const Shape& s, int64_t b, int64_t head, int64_t heads, int64_t row,
                                              int64_t seq) {
  return (s.seq_major ? (b * seq + row) * heads + head : (b * heads + head) * seq + row) * s.head_dim;
}

template <int kPer, typename T>
__device__ __forceinline__ void load_row(const T* base, int64_t head_dim, int lane, float (&row)[kPer]) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int64_t d = lane + 32 * t;
    row[t] = d < head_dim ? to_float(base[d]) : 0.0f;
  }
}

template <int kPer, typename T>
__device__ __forceinline__ void store_row(T* base, int64_t head_dim, int lane, const float (&row)[kPer]) {
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int64_t d = lane + 32 * t;
    if (d < head_dim) base[d] = from_float<T>(row[t]);
  }
}

template <int kPer>
__device__ __forceinline__ float dot(const float (&a)[kPer], const float (&b)[kPer]) {
  float partial = 0.0f;
#pragma unroll
  for (int t = 0; t < kPer; ++t) partial += a[t] * b[t];
  return warp_sum(partial);
}

// The additive bias of score (i, j) of batch b, query head h: 0 without a bias; broadcast over a batch or head
// axis of extent 1.
template <typename T>
__device__ __forceinline__ float bias_at(const Shape& s, const T* bias, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (s.bias_batch == 0) return 0.0f;  // no bias (Shape::has_bias is host code: api.hpp is also C++)
  const int64_t bb = s.bias_batch == 1 ? 0 : b, bh = s.bias_heads == 1 ? 0 : h;
  return to_float(bias[((bb * s.bias_heads + bh) * s.seq_q + i) * s.seq_k + j]);
}

// The scaled score s = scale q.k, soft-capped (c tanh(s / c)) when the shape asks for it.
__device__ __forceinline__ float capped_score(const Shape& s, float dot_product) {
  const float score = s.scale * dot_product;
  return s.softcap > 0.0f ? s.softcap * tanhf(score / s.softcap) : score;
}

// d capped / d s = 1 - tanh(s / c)^2 from the capped score (1 without a cap).
__device__ __forceinline__ float cap_derivative(const Shape& s, float capped) {
  if (s.softcap <= 0.0f) return 1.0f;
  const float t = capped / s.softcap;
  return 1.0f - t * t;
}

template <int kPer, typename T>
__global__ void __launch_bounds__(kWarps * 32)
    forward_kernel(Shape s, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const T* __restrict__ bias, T* __restrict__ o, float* __restrict__ lse) {
  const int lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (i >= s.seq_q) return;
  const int64_t bh = blockIdx.x, b = bh / s.heads_q, h = bh % s.heads_q;
  const int64_t hk = h / (s.heads_q / s.heads_kv);
  const int64_t q_offset = row_offset(s, b, h, s.heads_q, i, s.seq_q);

  float q_row[kPer], k_row[kPer], v_row[kPer], acc[kPer];
  load_row<kPer>(q + q_offset, s.head_dim, lane, q_row);
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  const int64_t end = s.key_end(i);
  for (int64_t j = s.key_begin(i); j < end; ++j) {
    const int64_t kv_offset = row_offset(s, b, hk, s.heads_kv, j, s.seq_k);
    load_row<kPer>(k + kv_offset, s.head_dim, lane, k_row);
    load_row<kPer>(v + kv_offset, s.head_dim, lane, v_row);
    const float score = capped_score(s, dot<kPer>(q_row, k_row)) + bias_at(s, bias, b, h, i, j);
    const float new_max = fmaxf(running_max, score);
    // A key hidden by a -inf bias adds nothing, also before the first visible one (no -inf - -inf).
    const float correction = running_max == -INFINITY ? 0.0f : __expf(running_max - new_max);
    const float p = score == -INFINITY ? 0.0f : __expf(score - new_max);
    running_sum = running_sum * correction + p;
#pragma unroll
    for (int t = 0; t < kPer; ++t) acc[t] = acc[t] * correction + p * v_row[t];
    running_max = new_max;
  }
  // A row with no visible key: O = 0 and lse = +inf (api.hpp).
  const float inverse = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
#pragma unroll
  for (int t = 0; t < kPer; ++t) acc[t] *= inverse;
  store_row<kPer>(o + q_offset, s.head_dim, lane, acc);
  if (lane == 0) lse[bh * s.seq_q + i] = running_sum > 0.0f ? running_max + logf(running_sum) : INFINITY;
}

// dQ of one query row, and D_i = dO_i . O_i for the dK/dV pass.
template <int kPer, typename T>
__global__ void __launch_bounds__(kWarps * 32)
    backward_query_kernel(Shape s, const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, const T* __restrict__ bias, const T* __restrict__ o,
                          const float* __restrict__ lse,
                          T* __restrict__ dq, float* __restrict__ row_dot) {
  const int lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (i >= s.seq_q) return;
  const int64_t bh = blockIdx.x, b = bh / s.heads_q, h = bh % s.heads_q;
  const int64_t hk = h / (s.heads_q / s.heads_kv);
  const int64_t q_offset = row_offset(s, b, h, s.heads_q, i, s.seq_q);

  float q_row[kPer], do_row[kPer], k_row[kPer], v_row[kPer], grad[kPer];
  load_row<kPer>(q + q_offset, s.head_dim, lane, q_row);
  load_row<kPer>(dout + q_offset, s.head_dim, lane, do_row);
  load_row<kPer>(o + q_offset, s.head_dim, lane, grad);  // O, only for D_i
  const float d_i = dot<kPer>(do_row, grad);
  if (lane == 0) row_dot[bh * s.seq_q + i] = d_i;
#pragma unroll
  for (int t = 0; t < kPer; ++t) grad[t] = 0.0f;
  const float lse_i = lse[bh * s.seq_q + i];
  const int64_t end = s.key_end(i);
  for (int64_t j = s.key_begin(i); j < end; ++j) {
    const int64_t kv_offset = row_offset(s, b, hk, s.heads_kv, j, s.seq_k);
    load_row<kPer>(k + kv_offset, s.head_dim, lane, k_row);
    load_row<kPer>(v + kv_offset, s.head_dim, lane, v_row);
    const float capped = capped_score(s, dot<kPer>(q_row, k_row));
    const float p = __expf(capped + bias_at(s, bias, b, h, i, j) - lse_i);
    const float ds = p * (dot<kPer>(do_row, v_row) - d_i) * cap_derivative(s, capped);
#pragma unroll
    for (int t = 0; t < kPer; ++t) grad[t] += ds * k_row[t];
  }
#pragma unroll
  for (int t = 0; t < kPer; ++t) grad[t] *= s.scale;
  store_row<kPer>(dq + q_offset, s.head_dim, lane, grad);
}

// dK and dV of one key row, summed over the query heads of its group and the query rows that see it.
template <int kPer, typename T>
__global__ void __launch_bounds__(kWarps * 32)
    backward_key_kernel(Shape s, const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, const T* __restrict__ bias, const float* __restrict__ lse,
                        const float* __restrict__ row_dot,
                        T* __restrict__ dk, T* __restrict__ dv) {
  const int lane = threadIdx.x & 31;
  const int64_t j = int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (j >= s.seq_k) return;
  const int64_t bhk = blockIdx.x, b = bhk / s.heads_kv, hk = bhk % s.heads_kv;
  const int64_t group = s.heads_q / s.heads_kv;
  const int64_t kv_offset = row_offset(s, b, hk, s.heads_kv, j, s.seq_k);

  float k_row[kPer], v_row[kPer], q_row[kPer], do_row[kPer], dk_acc[kPer], dv_acc[kPer];
  load_row<kPer>(k + kv_offset, s.head_dim, lane, k_row);
  load_row<kPer>(v + kv_offset, s.head_dim, lane, v_row);
#pragma unroll
  for (int t = 0; t < kPer; ++t) dk_acc[t] = dv_acc[t] = 0.0f;
  const int64_t begin = s.query_begin(j), end = s.query_end(j);  // the query rows that see key j
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t bh = b * s.heads_q + h;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t q_offset = row_offset(s, b, h, s.heads_q, i, s.seq_q);
      load_row<kPer>(q + q_offset, s.head_dim, lane, q_row);
      load_row<kPer>(dout + q_offset, s.head_dim, lane, do_row);
      const float capped = capped_score(s, dot<kPer>(q_row, k_row));
      const float p = __expf(capped + bias_at(s, bias, b, h, i, j) - lse[bh * s.seq_q + i]);
      const float ds = p * (dot<kPer>(do_row, v_row) - row_dot[bh * s.seq_q + i]) * cap_derivative(s, capped);
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        dv_acc[t] += p * do_row[t];
        dk_acc[t] += ds * q_row[t];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kPer; ++t) dk_acc[t] *= s.scale;
  store_row<kPer>(dk + kv_offset, s.head_dim, lane, dk_acc);
  store_row<kPer>(dv + kv_offset, s.head_dim, lane, dv_acc);
}

// Runs `body` with kPer bound to the smallest of 2, 4, 8 whose 32 * kPer covers head_dim.
template <typename Body>
void dispatch_width(int64_t head_dim, Body&& body) {
  if (head_dim <= 64) {
    body(std::integral_constant<int, 2>{});
  } else if (head_dim <= 128) {
    body(std::integral_constant<int, 4>{});
  } else {
    body(std::integral_constant<int, 8>{});
  }
}

// x: (batch, head) pairs, y: tiles of kWarps rows (the launcher checks the limits of both).
dim3 grid_for(int64_t rows, int64_t heads, int64_t batch) {
  return dim3(static_cast<unsigned>(batch * heads), static_cast<unsigned>((rows + kWarps - 1) / kWarps));
}

}  // namespace

void launch_rowwise_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  GE2_DISPATCH_FLOATING(s.dtype, "dtype", dispatch_width(s.head_dim, [&](auto per) {
    forward_kernel<decltype(per)::value, scalar_t><<<grid_for(s.seq_q, s.heads_q, s.batch), kWarps * 32, 0, stream>>>(
        s, static_cast<const scalar_t*>(args.q), static_cast<const scalar_t*>(args.k),
        static_cast<const scalar_t*>(args.v), static_cast<const scalar_t*>(args.bias), static_cast<scalar_t*>(args.o),
        args.lse);
  }));
  GE2_CHECK_LAUNCH("attention rowwise forward");
}

void launch_rowwise_backward(const BackwardArgs& args, float* row_dot, cudaStream_t stream) {
  const Shape& s = args.shape;
  GE2_DISPATCH_FLOATING(s.dtype, "dtype", dispatch_width(s.head_dim, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    backward_query_kernel<kPer, scalar_t><<<grid_for(s.seq_q, s.heads_q, s.batch), kWarps * 32, 0, stream>>>(
        s, static_cast<const scalar_t*>(args.dout), static_cast<const scalar_t*>(args.q),
        static_cast<const scalar_t*>(args.k), static_cast<const scalar_t*>(args.v),
        static_cast<const scalar_t*>(args.bias), static_cast<const scalar_t*>(args.o), args.lse,
        static_cast<scalar_t*>(args.dq), row_dot);
    GE2_CHECK_LAUNCH("attention rowwise backward (dQ)");
    backward_key_kernel<kPer, scalar_t><<<grid_for(s.seq_k, s.heads_kv, s.batch), kWarps * 32, 0, stream>>>(
        s, static_cast<const scalar_t*>(args.dout), static_cast<const scalar_t*>(args.q),
        static_cast<const scalar_t*>(args.k), static_cast<const scalar_t*>(args.v),
        static_cast<const scalar_t*>(args.bias), args.lse, row_dot, static_cast<scalar_t*>(args.dk),
        static_cast<scalar_t*>(args.dv));
  }));
  GE2_CHECK_LAUNCH("attention rowwise backward (dK, dV)");
}

}  // namespace ge2::attention
