// flash forward (FlashAttention-2 on mma.sync): a CTA owns kBlockM query rows of one (batch, head), four warps of
// 16 rows each, and walks the visible K/V tiles of kBlockN rows through shared memory with cp.async double
// buffering. Q stays in registers as A fragments; S = Q K^T and O += P V run on tensor cores with float32
// accumulators, and the online softmax (in the log2 domain) works on the S fragments in registers. A CTA walks only
// the key tiles its rows can see (causal and the sliding window bound them on both sides) and masks elements only in
// the tiles that cross a band edge or the end of K. The soft cap (c tanh(s / c)) applies to the scaled scores in
// registers.
#include <cmath>

#include "api.hpp"
#include "flash_common.cuh"
#include "status.hpp"

namespace ge2::attention {
namespace {

using namespace flash;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = 16 * kWarps;
constexpr int kBlockN = 64;

template <int kHeadDim>
constexpr int forward_shared_bytes() {
  return (kBlockM + 4 * kBlockN) * kHeadDim * 2;  // Q, two K buffers, two V buffers
}

template <int kHeadDim, typename T>
__global__ void __launch_bounds__(kThreads, 2)
    flash_forward_kernel(Shape s, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ o, float* __restrict__ lse) {
  extern __shared__ __align__(128) unsigned char shared[];
  T* q_tile = reinterpret_cast<T*>(shared);
  T* k_tiles = q_tile + kBlockM * kHeadDim;
  T* v_tiles = k_tiles + 2 * kBlockN * kHeadDim;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.x, b = bh / s.heads_q, h = bh % s.heads_q;
  const int64_t hk = h / (s.heads_q / s.heads_kv);
  const int64_t m0 = int64_t(gridDim.y - 1 - blockIdx.y) * kBlockM;  // the longest causal rows start first
  const RowAddressing qa = rows_of(s, b, h, s.heads_q, s.seq_q);
  const RowAddressing ka = rows_of(s, b, hk, s.heads_kv, s.seq_k);
  const T* q_rows = q + qa.base + m0 * qa.pitch;
  const T* k_rows = k + ka.base;
  const T* v_rows = v + ka.base;

  // The key tiles the CTA's rows see: from the first row's first key to the last row's last key (both grow with
  // the row). None when every row of the CTA sees no key.
  const int64_t last_row = (m0 + kBlockM < s.seq_q ? m0 + kBlockM : s.seq_q) - 1;
  const int64_t first_tile = s.key_begin(m0) / kBlockN;
  const int64_t key_stop = s.key_end(last_row);
  const int64_t tiles = key_stop > first_tile * kBlockN ? (key_stop + kBlockN - 1) / kBlockN - first_tile : 0;
  const int64_t first_key = first_tile * kBlockN;

  copy_tile<kBlockM, kHeadDim, kThreads>(q_tile, q_rows, qa.pitch, s.seq_q - m0);
  copy_tile<kBlockN, kHeadDim, kThreads>(k_tiles, k_rows + first_key * ka.pitch, ka.pitch, s.seq_k - first_key);
  commit_copies();
  copy_tile<kBlockN, kHeadDim, kThreads>(v_tiles, v_rows + first_key * ka.pitch, ka.pitch, s.seq_k - first_key);
  commit_copies();

  uint32_t q_fragments[kHeadDim / 16][4];
  float out[kHeadDim / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = s.scale * kLog2e;
  const int64_t row_min = m0 + warp * 16;  // this warp's first row; its two rows per thread follow
  const int64_t rows[2] = {row_min + (lane >> 2), row_min + (lane >> 2) + 8};
  const int64_t begins[2] = {s.key_begin(rows[0]), s.key_begin(rows[1])};
  const int64_t ends[2] = {s.key_end(rows[0]), s.key_end(rows[1])};
  // Tiles inside [warp_begin, warp_end) are visible to all of the warp's rows: no element mask there.
  const int64_t warp_begin = s.key_begin(row_min + 15), warp_end = s.key_end(row_min);

  for (int64_t j = 0; j < tiles; ++j) {  // the CTA's j-th visible tile
    const int buffer = static_cast<int>(j & 1);
    const T* k_tile = k_tiles + buffer * kBlockN * kHeadDim;
    const T* v_tile = v_tiles + buffer * kBlockN * kHeadDim;
    wait_copies<1>();  // K_j (and Q) landed; V_j may still be in flight
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        load_matrix_x4(q_fragments[kk], shared_address(q_tile + a_operand<kHeadDim>(lane, warp * 16, kk * 16)));
      }
    }
    const int64_t n0 = first_key + j * kBlockN;
    if (j + 1 < tiles) {
      copy_tile<kBlockN, kHeadDim, kThreads>(k_tiles + (buffer ^ 1) * kBlockN * kHeadDim,
                                             k_rows + (n0 + kBlockN) * ka.pitch, ka.pitch, s.seq_k - n0 - kBlockN);
    }
    commit_copies();

    float scores[kBlockN / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) scores[n][0] = scores[n][1] = scores[n][2] = scores[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        uint32_t keys[4];
        load_matrix_x4(keys, shared_address(k_tile + b_rows<kHeadDim>(lane, np * 16, kk * 16)));
        mma<T>(scores[2 * np], q_fragments[kk], keys[0], keys[1]);
        mma<T>(scores[2 * np + 1], q_fragments[kk], keys[2], keys[3]);
      }
    }

    const bool masked = n0 < warp_begin || n0 + kBlockN > warp_end;
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t column = n0 + n * 8 + 2 * (lane & 3) + (e & 1);
        const bool hidden = masked && (column < begins[e >> 1] || column >= ends[e >> 1]);
        if (s.softcap > 0.0f) {  // c tanh(scale s / c), into the log2 domain
          scores[n][e] = softcap_log2(scores[n][e] * s.scale, s.softcap);
        } else {
          scores[n][e] *= scale_log2;
        }
        if (hidden) scores[n][e] = -INFINITY;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(scores[n][2 * r], scores[n][2 * r + 1]));
      const RowRescale step = rescale_row(row_max[r], tile_max);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
        scores[n][2 * r] = exp2f(scores[n][2 * r] - step.base);
        scores[n][2 * r + 1] = exp2f(scores[n][2 * r + 1] - step.base);
        sum += scores[n][2 * r] + scores[n][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * step.correction + sum;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        out[n][2 * r] *= step.correction;
        out[n][2 * r + 1] *= step.correction;
      }
    }

    wait_copies<1>();  // V_j landed; K_{j+1} may still be in flight
    __syncthreads();
    if (j + 1 < tiles) {
      copy_tile<kBlockN, kHeadDim, kThreads>(v_tiles + (buffer ^ 1) * kBlockN * kHeadDim,
                                             v_rows + (n0 + kBlockN) * ka.pitch, ka.pitch, s.seq_k - n0 - kBlockN);
    }
    commit_copies();

#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t p[4];
      to_a_fragment<T>(p, scores[2 * kk], scores[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < kHeadDim / 16; ++np) {
        uint32_t values[4];
        load_matrix_x4_transposed(values, shared_address(v_tile + b_columns<kHeadDim>(lane, kk * 16, np * 16)));
        mma<T>(out[2 * np], p, values[0], values[1]);
        mma<T>(out[2 * np + 1], p, values[2], values[3]);
      }
    }
  }
  wait_copies<0>();  // nothing may be left in flight when the CTA exits

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (rows[r] >= s.seq_q) continue;
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row with no visible key: O = 0, lse = +inf
    T* o_row = o + qa.base + rows[r] * qa.pitch + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      *reinterpret_cast<uint32_t*>(o_row + n * 8) = pack<T>(out[n][2 * r] * inverse, out[n][2 * r + 1] * inverse);
    }
    if ((lane & 3) == 0) lse[bh * s.seq_q + rows[r]] = sum > 0.0f ? row_max[r] * kLn2 + logf(sum) : INFINITY;
  }
}

template <int kHeadDim, typename T>
void launch(const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  constexpr int bytes = forward_shared_bytes<kHeadDim>();
  check_cuda(cudaFuncSetAttribute(flash_forward_kernel<kHeadDim, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  bytes),
             GE2_OP_NAME, "cudaFuncSetAttribute(flash forward shared memory)");
  const dim3 grid(static_cast<unsigned>(s.batch * s.heads_q), static_cast<unsigned>((s.seq_q + kBlockM - 1) / kBlockM));
  flash_forward_kernel<kHeadDim, T><<<grid, kThreads, bytes, stream>>>(
      s, static_cast<const T*>(args.q), static_cast<const T*>(args.k), static_cast<const T*>(args.v),
      static_cast<T*>(args.o), args.lse);
}

}  // namespace

void launch_flash_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  const bool wide = s.head_dim == 128;
  if (s.dtype == DType::Float16) {
    wide ? launch<128, __half>(args, stream) : launch<64, __half>(args, stream);
  } else {
    wide ? launch<128, __nv_bfloat16>(args, stream) : launch<64, __nv_bfloat16>(args, stream);
  }
  GE2_CHECK_LAUNCH("attention flash forward");
}

}  // namespace ge2::attention
