// flash backward (FlashAttention-2 on mma.sync), three kernels in stream order:
// 1. row_dot: D_i = dO_i . O_i (float32) and zeroes the float32 dQ accumulator;
// 2. the main kernel: a CTA owns kBlockN key rows of one (batch, K/V head), four warps of 16 key rows each, and
//    walks the query tiles that see them (every query head of the group) through double-buffered shared memory.
//    Each warp computes S^T = K Q^T and dP^T = V dO^T for its key rows, P^T = exp(scale S^T - lse) and
//    dS^T = P^T (dP^T - D), and keeps dV += P^T dO and dK += dS^T Q in registers (one writer per element). dS^T goes
//    through shared memory so that dQ_tile += dS K can be split by query rows over the warps and added to the
//    float32 accumulator with atomics;
// 3. dQ = scale * accumulator, rounded into dq's layout.
// Causal and the sliding window bound the query tiles a key block walks on both sides; elements outside a row's band
// get P = 0. With a soft cap, dS also takes the cap's derivative 1 - t^2, t = tanh(s / c) = (ln P + lse) / c: read
// back from P in registers rather than kept in another 32 of them (where P is 0, so is dS).
#include <cmath>
#include <cstdint>

#include "api.hpp"
#include "flash_common.cuh"
#include "status.hpp"

namespace ge2::attention {
namespace {

using namespace flash;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockN = 16 * kWarps;  // key rows per CTA
constexpr int kBlockM = 64;           // query rows per step

template <int kHeadDim>
constexpr int backward_shared_bytes() {
  // K, V; two buffers of Q and dO; dS^T; two buffers of lse and D.
  return (2 * kBlockN * kHeadDim + 4 * kBlockM * kHeadDim + kBlockN * kBlockM) * 2 + 4 * kBlockM * 4;
}

// Both preprocess kernels move 16-byte chunks of 8 values: `lanes` = head_dim / 8 threads a row (8, 16 or 32; a
// power of two, so a row's lanes are an aligned group of a warp), one chunk each. In bhsd a row's values are
// row * head_dim from the start, as in the accumulator; bshd needs the row's (batch, head, position).
__device__ __forceinline__ int64_t row_offset(const Shape& s, int64_t row) {
  if (!s.seq_major) return row * s.head_dim;
  const int64_t bh = row / s.seq_q, i = row % s.seq_q;
  const RowAddressing a = rows_of(s, bh / s.heads_q, bh % s.heads_q, s.heads_q, s.seq_q);
  return a.base + i * a.pitch;
}

template <typename T>
__device__ __forceinline__ float dot8(const uint4& x, const uint4& y) {
  const T* a = reinterpret_cast<const T*>(&x);
  const T* b = reinterpret_cast<const T*>(&y);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) sum += to_float(a[e]) * to_float(b[e]);
  return sum;
}

template <typename T>
__global__ void row_dot_kernel(Shape s, const T* __restrict__ dout, const T* __restrict__ o,
                               float* __restrict__ row_dot, float* __restrict__ dq_accumulator, bool wide_o) {
  const int lanes = int(s.head_dim / 8);
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread >> (__ffs(lanes) - 1);  // over batch, heads_q, seq_q
  const int chunk = int(thread & (lanes - 1));
  const bool active = row < s.batch * s.heads_q * s.seq_q;
  float partial = 0.0f;
  if (active) {
    const int64_t at = row_offset(s, row) + chunk * 8;
    uint4 o_chunk;
    if (wide_o) {
      o_chunk = *reinterpret_cast<const uint4*>(o + at);
    } else {  // flash's o (the forward's output) may be only 4-byte aligned
      const uint32_t* pairs = reinterpret_cast<const uint32_t*>(o + at);
      o_chunk = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
    partial = dot8<T>(*reinterpret_cast<const uint4*>(dout + at), o_chunk);
    float4* zero = reinterpret_cast<float4*>(dq_accumulator + row * s.head_dim + chunk * 8);
    zero[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (int offset = lanes / 2; offset > 0; offset >>= 1) partial += __shfl_xor_sync(0xffffffffu, partial, offset);
  if (active && chunk == 0) row_dot[row] = partial;
}

// kSoftcap: a separate instantiation, because the cap's code costs the head_dim-128 kernel registers it spills.
template <int kHeadDim, typename T, bool kSoftcap>
__global__ void __launch_bounds__(kThreads, 2)
    flash_backward_kernel(Shape s, const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ row_dot,
                          float* __restrict__ dq_accumulator, T* __restrict__ dk, T* __restrict__ dv) {
  extern __shared__ __align__(128) unsigned char shared[];
  T* k_tile = reinterpret_cast<T*>(shared);
  T* v_tile = k_tile + kBlockN * kHeadDim;
  T* q_tiles = v_tile + kBlockN * kHeadDim;
  T* do_tiles = q_tiles + 2 * kBlockM * kHeadDim;
  T* ds_tile = do_tiles + 2 * kBlockM * kHeadDim;  // [key][query], swizzled
  float* lse_tiles = reinterpret_cast<float*>(ds_tile + kBlockN * kBlockM);
  float* dot_tiles = lse_tiles + 2 * kBlockM;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bhk = blockIdx.x, b = bhk / s.heads_kv, hk = bhk % s.heads_kv;
  const int64_t group = s.heads_q / s.heads_kv;
  const int64_t n0 = int64_t(blockIdx.y) * kBlockN;
  const RowAddressing ka = rows_of(s, b, hk, s.heads_kv, s.seq_k);

  // Steps: (query head of the group, query tile), over the tiles holding a row that sees one of the CTA's keys:
  // from the rows of the first key to those of the last (both bounds grow with the key).
  const int64_t last_key = (n0 + kBlockN < s.seq_k ? n0 + kBlockN : s.seq_k) - 1;
  const int64_t query_begin = s.query_begin(n0), query_end = s.query_end(last_key);
  const int64_t first_tile = query_begin / kBlockM;
  const int64_t tiles_per_head =
      query_end > query_begin && query_begin < s.seq_q ? (query_end + kBlockM - 1) / kBlockM - first_tile : 0;
  const int64_t steps = group * tiles_per_head;

  auto start_step = [&](int64_t step, int buffer) {
    const int64_t h = hk * group + step / tiles_per_head;
    const int64_t m0 = (first_tile + step % tiles_per_head) * kBlockM;
    const RowAddressing qa = rows_of(s, b, h, s.heads_q, s.seq_q);
    copy_tile<kBlockM, kHeadDim, kThreads>(q_tiles + buffer * kBlockM * kHeadDim, q + qa.base + m0 * qa.pitch,
                                           qa.pitch, s.seq_q - m0);
    copy_tile<kBlockM, kHeadDim, kThreads>(do_tiles + buffer * kBlockM * kHeadDim, dout + qa.base + m0 * qa.pitch,
                                           qa.pitch, s.seq_q - m0);
    const int64_t stats = (b * s.heads_q + h) * s.seq_q;
    if (threadIdx.x < kBlockM) {
      const bool valid = m0 + threadIdx.x < s.seq_q;
      const int64_t at = valid ? stats + m0 + threadIdx.x : stats;
      copy_4(shared_address(lse_tiles + buffer * kBlockM + threadIdx.x), lse + at, valid);
      copy_4(shared_address(dot_tiles + buffer * kBlockM + threadIdx.x), row_dot + at, valid);
    }
  };

  copy_tile<kBlockN, kHeadDim, kThreads>(k_tile, k + ka.base + n0 * ka.pitch, ka.pitch, s.seq_k - n0);
  copy_tile<kBlockN, kHeadDim, kThreads>(v_tile, v + ka.base + n0 * ka.pitch, ka.pitch, s.seq_k - n0);
  if (steps > 0) start_step(0, 0);
  commit_copies();

  float dk_acc[kHeadDim / 8][4], dv_acc[kHeadDim / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
  }
  const float scale_log2 = s.scale * kLog2e;
  const int key_row0 = warp * 16;  // this warp's key rows in the tile
  const int64_t keys[2] = {n0 + key_row0 + (lane >> 2), n0 + key_row0 + (lane >> 2) + 8};
  // The query rows that see each of the thread's two keys, [query_from, query_to) (none past the end of K), once per
  // CTA: the per-element test is then two 32-bit compares (lengths are <= kMaxSeq).
  int query_from[2], query_to[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool key_valid = keys[r] < s.seq_k;
    query_from[r] = key_valid ? static_cast<int>(s.query_begin(keys[r])) : 0;
    query_to[r] = key_valid ? static_cast<int>(s.query_end(keys[r])) : 0;
  }

  for (int64_t step = 0; step < steps; ++step) {
    const int buffer = static_cast<int>(step & 1);
    const T* q_tile = q_tiles + buffer * kBlockM * kHeadDim;
    const T* do_tile = do_tiles + buffer * kBlockM * kHeadDim;
    const float* lse_tile = lse_tiles + buffer * kBlockM;
    const float* dot_tile = dot_tiles + buffer * kBlockM;
    wait_copies<0>();
    __syncthreads();
    if (step + 1 < steps) start_step(step + 1, buffer ^ 1);
    commit_copies();
    const int64_t h = hk * group + step / tiles_per_head;
    const int64_t m0 = (first_tile + step % tiles_per_head) * kBlockM;

    // S^T = K Q^T (this warp's 16 keys x kBlockM queries), then P^T.
    float p[kBlockM / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      load_matrix_x4(a, shared_address(k_tile + a_operand<kHeadDim>(lane, key_row0, kk * 16)));
#pragma unroll
      for (int np = 0; np < kBlockM / 16; ++np) {
        uint32_t bq[4];
        load_matrix_x4(bq, shared_address(q_tile + b_rows<kHeadDim>(lane, np * 16, kk * 16)));
        mma<T>(p[2 * np], a, bq[0], bq[1]);
        mma<T>(p[2 * np + 1], a, bq[2], bq[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = n * 8 + 2 * (lane & 3) + (e & 1);
        const int query = static_cast<int>(m0) + column;  // query_to <= seq_q
        const bool visible = query >= query_from[e >> 1] && query < query_to[e >> 1];
        const float score = kSoftcap ? softcap_log2(p[n][e] * s.scale, s.softcap) : p[n][e] * scale_log2;
        p[n][e] = visible ? exp2f(score - lse_tile[column] * kLog2e) : 0.0f;
      }
    }

    // dV += P^T dO.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t a[4];
      to_a_fragment<T>(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < kHeadDim / 16; ++np) {
        uint32_t bo[4];
        load_matrix_x4_transposed(bo, shared_address(do_tile + b_columns<kHeadDim>(lane, kk * 16, np * 16)));
        mma<T>(dv_acc[2 * np], a, bo[0], bo[1]);
        mma<T>(dv_acc[2 * np + 1], a, bo[2], bo[3]);
      }
    }

    // dP^T = V dO^T, then dS^T = P^T (dP^T - D) in place.
    float ds[kBlockM / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) ds[n][0] = ds[n][1] = ds[n][2] = ds[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[4];
      load_matrix_x4(a, shared_address(v_tile + a_operand<kHeadDim>(lane, key_row0, kk * 16)));
#pragma unroll
      for (int np = 0; np < kBlockM / 16; ++np) {
        uint32_t bo[4];
        load_matrix_x4(bo, shared_address(do_tile + b_rows<kHeadDim>(lane, np * 16, kk * 16)));
        mma<T>(ds[2 * np], a, bo[0], bo[1]);
        mma<T>(ds[2 * np + 1], a, bo[2], bo[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = n * 8 + 2 * (lane & 3) + (e & 1);
        ds[n][e] = p[n][e] * (ds[n][e] - dot_tile[column]);
        if (kSoftcap && p[n][e] > 0.0f) {
          const float t = (__log2f(p[n][e]) * kLn2 + lse_tile[column]) / s.softcap;
          ds[n][e] *= 1.0f - t * t;
        }
      }
    }

    // dK += dS^T Q, and dS^T to shared memory for dQ.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t a[4];
      to_a_fragment<T>(a, ds[2 * kk], ds[2 * kk + 1]);
      const int column = kk * 16 + 2 * (lane & 3), row = key_row0 + (lane >> 2);
      *reinterpret_cast<uint32_t*>(ds_tile + swizzled<kBlockM>(row, column)) = a[0];
      *reinterpret_cast<uint32_t*>(ds_tile + swizzled<kBlockM>(row + 8, column)) = a[1];
      *reinterpret_cast<uint32_t*>(ds_tile + swizzled<kBlockM>(row, column + 8)) = a[2];
      *reinterpret_cast<uint32_t*>(ds_tile + swizzled<kBlockM>(row + 8, column + 8)) = a[3];
#pragma unroll
      for (int np = 0; np < kHeadDim / 16; ++np) {
        uint32_t bq[4];
        load_matrix_x4_transposed(bq, shared_address(q_tile + b_columns<kHeadDim>(lane, kk * 16, np * 16)));
        mma<T>(dk_acc[2 * np], a, bq[0], bq[1]);
        mma<T>(dk_acc[2 * np + 1], a, bq[2], bq[3]);
      }
    }
    __syncthreads();

    // dQ_tile += dS K: this warp's 16 query rows, every column, over the CTA's kBlockN keys.
    uint32_t ds_fragments[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      load_matrix_x4_transposed(ds_fragments[kk],
                                shared_address(ds_tile + a_transposed<kBlockM>(lane, kk * 16, warp * 16)));
    }
    const int64_t query0 = m0 + warp * 16 + (lane >> 2);
    float* accumulator_rows = dq_accumulator + ((b * s.heads_q + h) * s.seq_q + query0) * kHeadDim + 2 * (lane & 3);
#pragma unroll
    for (int np = 0; np < kHeadDim / 16; ++np) {
      float dq[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t bk[4];
        load_matrix_x4_transposed(bk, shared_address(k_tile + b_columns<kHeadDim>(lane, kk * 16, np * 16)));
        mma<T>(dq[0], ds_fragments[kk], bk[0], bk[1]);
        mma<T>(dq[1], ds_fragments[kk], bk[2], bk[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float* at = accumulator_rows + np * 16 + half * 8;
        if (query0 < s.seq_q) {
          atomicAdd(at, dq[half][0]);
          atomicAdd(at + 1, dq[half][1]);
        }
        if (query0 + 8 < s.seq_q) {
          atomicAdd(at + 8 * kHeadDim, dq[half][2]);
          atomicAdd(at + 8 * kHeadDim + 1, dq[half][3]);
        }
      }
    }
  }
  wait_copies<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= s.seq_k) continue;
    const int64_t offset = ka.base + keys[r] * ka.pitch + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dk + offset + n * 8) =
          pack<T>(dk_acc[n][2 * r] * s.scale, dk_acc[n][2 * r + 1] * s.scale);
      *reinterpret_cast<uint32_t*>(dv + offset + n * 8) = pack<T>(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]);
    }
  }
}

// dq = scale * accumulator, 8 values a thread: one 16-byte store where dq is 16-byte aligned (flash_sm90 requires
// it), else four 4-byte pairs (flash requires 4 bytes).
template <typename T>
__global__ void dq_store_kernel(Shape s, const float* __restrict__ dq_accumulator, T* __restrict__ dq, bool wide) {
  const int lanes = int(s.head_dim / 8);
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread >> (__ffs(lanes) - 1);
  const int chunk = int(thread & (lanes - 1));
  if (row >= s.batch * s.heads_q * s.seq_q) return;
  const float4* in = reinterpret_cast<const float4*>(dq_accumulator + row * s.head_dim + chunk * 8);
  const float4 x = in[0], y = in[1];
  const uint4 packed = make_uint4(pack<T>(x.x * s.scale, x.y * s.scale), pack<T>(x.z * s.scale, x.w * s.scale),
                                  pack<T>(y.x * s.scale, y.y * s.scale), pack<T>(y.z * s.scale, y.w * s.scale));
  T* out = dq + row_offset(s, row) + chunk * 8;
  if (wide) {
    *reinterpret_cast<uint4*>(out) = packed;
  } else {
    uint32_t* pairs = reinterpret_cast<uint32_t*>(out);
    pairs[0] = packed.x;
    pairs[1] = packed.y;
    pairs[2] = packed.z;
    pairs[3] = packed.w;
  }
}

template <int kHeadDim, typename T>
void launch(const BackwardArgs& args, float* row_dot, float* dq_accumulator, cudaStream_t stream) {
  const Shape& s = args.shape;
  constexpr int bytes = backward_shared_bytes<kHeadDim>();
  auto kernel =
      s.softcap > 0.0f ? flash_backward_kernel<kHeadDim, T, true> : flash_backward_kernel<kHeadDim, T, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), GE2_OP_NAME,
             "cudaFuncSetAttribute(flash backward shared memory)");
  const dim3 grid(static_cast<unsigned>(s.batch * s.heads_kv),
                  static_cast<unsigned>((s.seq_k + kBlockN - 1) / kBlockN));
  kernel<<<grid, kThreads, bytes, stream>>>(
      s, static_cast<const T*>(args.dout), static_cast<const T*>(args.q), static_cast<const T*>(args.k),
      static_cast<const T*>(args.v), args.lse, row_dot, dq_accumulator, static_cast<T*>(args.dk),
      static_cast<T*>(args.dv));
  GE2_CHECK_LAUNCH("attention flash backward (dK, dV, dQ accumulation)");
}

// Blocks of 256 threads over rows x head_dim / 8 chunks (head_dim 64, 128 or 256: flash's and flash_sm90's).
inline unsigned preprocess_blocks(const Shape& s) {
  return static_cast<unsigned>((s.batch * s.heads_q * s.seq_q * (s.head_dim / 8) + 255) / 256);
}

template <typename T>
void launch_row_dot(const BackwardArgs& args, float* row_dot, float* dq_accumulator, cudaStream_t stream) {
  const Shape& s = args.shape;
  const bool wide_o = reinterpret_cast<std::uintptr_t>(args.o) % 16 == 0;  // dout: an input, 16-byte aligned
  row_dot_kernel<T><<<preprocess_blocks(s), 256, 0, stream>>>(
      s, static_cast<const T*>(args.dout), static_cast<const T*>(args.o), row_dot, dq_accumulator, wide_o);
  GE2_CHECK_LAUNCH("attention flash backward (row dot)");
}

template <typename T>
void launch_dq_store(const BackwardArgs& args, const float* dq_accumulator, cudaStream_t stream) {
  const Shape& s = args.shape;
  const bool wide = reinterpret_cast<std::uintptr_t>(args.dq) % 16 == 0;
  dq_store_kernel<T><<<preprocess_blocks(s), 256, 0, stream>>>(s, dq_accumulator, static_cast<T*>(args.dq), wide);
  GE2_CHECK_LAUNCH("attention flash backward (dQ store)");
}

}  // namespace

std::size_t flash_backward_workspace_bytes(const Shape& s) {
  const auto rows = static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q);
  return rows * sizeof(float) * (1 + static_cast<std::size_t>(s.head_dim));
}

FlashBackwardWorkspace flash_backward_workspace(const Shape& s, void* workspace) {
  // The accumulator first: its rows stay 16-byte aligned for flash_sm90's float4 atomics whatever the row count.
  float* dq_accumulator = static_cast<float*>(workspace);
  return {dq_accumulator + s.batch * s.heads_q * s.seq_q * s.head_dim, dq_accumulator};
}

void launch_flash_backward_row_dot(const BackwardArgs& args, const FlashBackwardWorkspace& workspace,
                                   cudaStream_t stream) {
  if (args.shape.dtype == DType::Float16) {
    launch_row_dot<__half>(args, workspace.row_dot, workspace.dq_accumulator, stream);
  } else {
    launch_row_dot<__nv_bfloat16>(args, workspace.row_dot, workspace.dq_accumulator, stream);
  }
}

void launch_flash_backward_dq_store(const BackwardArgs& args, const FlashBackwardWorkspace& workspace,
                                    cudaStream_t stream) {
  if (args.shape.dtype == DType::Float16) {
    launch_dq_store<__half>(args, workspace.dq_accumulator, stream);
  } else {
    launch_dq_store<__nv_bfloat16>(args, workspace.dq_accumulator, stream);
  }
}

void launch_flash_backward(const BackwardArgs& args, void* workspace, cudaStream_t stream) {
  const Shape& s = args.shape;
  const FlashBackwardWorkspace scratch = flash_backward_workspace(s, workspace);
  launch_flash_backward_row_dot(args, scratch, stream);
  const bool wide = s.head_dim == 128;
  if (s.dtype == DType::Float16) {
    wide ? launch<128, __half>(args, scratch.row_dot, scratch.dq_accumulator, stream)
         : launch<64, __half>(args, scratch.row_dot, scratch.dq_accumulator, stream);
  } else {
    wide ? launch<128, __nv_bfloat16>(args, scratch.row_dot, scratch.dq_accumulator, stream)
         : launch<64, __nv_bfloat16>(args, scratch.row_dot, scratch.dq_accumulator, stream);
  }
  launch_flash_backward_dq_store(args, scratch, stream);
}

}  // namespace ge2::attention
