// unfused: attention through memory, for any head_dim and length. Per chunk of the problem: S = scale Q K^T on
// cuBLASLt (float32 scores), a block per score row for the soft cap, the mask (causal, window) and the softmax
// (float32 statistics; writes lse and P), then O = P V on cuBLASLt. The backward recomputes P from the saved lse and
// runs
//   dV += P^T dO;  dP = dO V^T;  dS = P (dP - D), D_i = dO_i . O_i;  dQ = scale dS K;  dK += scale dS^T Q.
//
// Precision. cuBLASLt multiplies A and B of one type, so the tensor-core GEMMs need P (and dS) in the input dtype.
// Rounding the float32 P to 16 bits once would cost an ulp of the output (ONNX's float16 conformance, rtol 1e-3,
// sees it), so 16-bit P and dS are stored as two parts: hi = fl(P) and lo = fl((P - hi) 2^t), t = 11 for float16 and
// 8 for bfloat16 (their unit roundoffs are 2^-t). P - hi is exact in float32 and at most 2^-t |P|, so lo is at most
// |P| (no overflow), and lo's own rounding leaves
//   |P - (hi + 2^-t lo)| <= 2^-2t |P| (+ 2^-36 absolute for float16, where lo falls below its normal range),
// 2^-22 for float16 (float32's own rounding of the GEMM sums is as large) and 2^-16 for bfloat16 (2^8 below its unit
// roundoff). Each product with P or dS is then two GEMMs, the second with alpha 2^-t and beta = 1, into float32
// accumulators (O, dQ per chunk; dK, dV per block of units) that are rounded once to the output dtype. float32
// storage keeps P whole: one GEMM per product, written in place.
//
// Units. A unit is one (batch, K/V head); its query rows form a matrix with a constant row pitch, so a GEMM reads the
// layout in place. In bhsd the G query heads of a group are adjacent: the unit is G * seq_q rows and one GEMM covers
// the group (dK, dV sum over the group's heads inside the GEMM). In bshd a query head's rows are heads_q * head_dim
// apart and the group's heads interleave: each head of the group is a pass of seq_q rows. A batched GEMM spans
// consecutive units of one stride: every unit in bhsd, the K/V heads of one batch element in bshd.
//
// Chunks. The scratch of a chunk's query rows (float32 S, P in one or two parts, and for 16-bit storage the float32
// rows of O or dQ) stays under kScoreBudgetBytes of the per-stream workspace: whole units where one fits, else row
// blocks of one unit. dQ rows are complete per chunk; dK, dV add up over a unit's passes and row blocks (GEMM
// beta = 1).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "api.hpp"
#include "batched_gemm.hpp"
#include "reduction.hpp"
#include "status.hpp"

namespace ge2::attention {
namespace {

// A chunk's scratch: (1, 32, 8192, 128) takes half a head (258 MiB) per chunk in float16, a whole one in float32.
constexpr std::size_t kScoreBudgetBytes = std::size_t(512) << 20;
constexpr const char* kScoreBudgetVariable = "GE2_ATTENTION_SCORE_BUDGET";
constexpr int kRowThreads = 256;

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t divide_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// kScoreBudgetBytes, or the bytes GE2_ATTENTION_SCORE_BUDGET names (a smaller bound on memory; the tests cut small
// problems into many chunks with it).
int64_t score_budget_bytes() {
  const char* value = std::getenv(kScoreBudgetVariable);
  if (value == nullptr || *value == '\0') return static_cast<int64_t>(kScoreBudgetBytes);
  char* end = nullptr;
  const long long bytes = std::strtoll(value, &end, 10);
  if (*end != '\0' || bytes < 1) {
    throw std::invalid_argument(std::string(kScoreBudgetVariable) + ": expected a positive number of bytes, got '" +
                                value + "'");
  }
  return bytes;
}

// 2^t of the top comment: what the 16-bit residual part of P or dS is scaled by (1 for float32, which has none).
float residual_scale(DType dtype) {
  switch (dtype) {
    case DType::Float16: return 2048.0f;  // 2^11
    case DType::BFloat16: return 256.0f;  // 2^8
    default: return 1.0f;
  }
}

// Where the units' rows are (element offsets, pitches) and how the problem is cut into chunks.
struct Plan {
  Shape s;
  bool split = false;  // 16-bit storage: P, dS in two parts, outputs through float32 accumulators
  int64_t group = 1;   // query heads per K/V head
  int64_t units = 0;   // batch * heads_kv
  int64_t run = 0;     // consecutive units one batched GEMM may span
  int64_t passes = 1;  // query heads of a group done one after the other (bshd)
  int64_t rows = 0;    // query rows of a unit in one pass
  int64_t q_pitch = 0, kv_pitch = 0;              // elements between consecutive rows
  int64_t q_unit_stride = 0, kv_unit_stride = 0;  // elements between consecutive units of a run
  int64_t stat_unit_stride = 0;                   // lse / D entries between consecutive units
  int64_t units_per_chunk = 0, rows_per_chunk = 0;

  explicit Plan(const Shape& shape) : s(shape) {
    split = s.dtype != DType::Float32;
    group = s.heads_q / s.heads_kv;
    units = s.batch * s.heads_kv;
    stat_unit_stride = group * s.seq_q;
    if (s.seq_major) {
      run = s.heads_kv, passes = group, rows = s.seq_q;
      q_pitch = s.heads_q * s.head_dim, kv_pitch = s.heads_kv * s.head_dim;
      q_unit_stride = group * s.head_dim, kv_unit_stride = s.head_dim;
    } else {
      run = units, passes = 1, rows = group * s.seq_q;
      q_pitch = kv_pitch = s.head_dim;
      q_unit_stride = group * s.seq_q * s.head_dim, kv_unit_stride = s.seq_k * s.head_dim;
    }
    // scratch per query row: S and the P parts, and the row of the float32 O or dQ accumulator
    const auto bytes_per_score = static_cast<int64_t>(sizeof(float) + (split ? 2 : 1) * dtype_size(s.dtype));
    const int64_t bytes_per_row =
        s.seq_k * bytes_per_score + (split ? s.head_dim * static_cast<int64_t>(sizeof(float)) : 0);
    // a chunk's score rows are one grid of blocks: at most 2^31 - 1
    const int64_t budget_rows = std::min<int64_t>(score_budget_bytes() / bytes_per_row, 0x7fffffff);
    if (rows <= budget_rows) {  // whole units, as many as fit, spread evenly over the chunks of a run
      rows_per_chunk = rows;
      units_per_chunk = divide_up(run, divide_up(run, std::min(run, budget_rows / rows)));
    } else {  // row blocks of one unit, of even sizes
      units_per_chunk = 1;
      rows_per_chunk = divide_up(rows, divide_up(rows, std::max<int64_t>(budget_rows, 1)));
    }
  }

  std::size_t scores_per_chunk() const {
    return static_cast<std::size_t>(units_per_chunk * rows_per_chunk) * static_cast<std::size_t>(s.seq_k);
  }
  // Element offsets of a unit's first row (in pass `pass`) in q-shaped and k-shaped arrays, and of its first
  // statistic in lse-shaped ones ([batch, heads_q, seq_q]: the unit's heads are adjacent there in both layouts).
  int64_t q_offset(int64_t unit, int64_t pass) const {
    if (!s.seq_major) return unit * q_unit_stride;
    const int64_t b = unit / s.heads_kv, kv_head = unit % s.heads_kv;
    return b * s.seq_q * s.heads_q * s.head_dim + (kv_head * group + pass) * s.head_dim;
  }
  int64_t kv_offset(int64_t unit) const {
    if (!s.seq_major) return unit * kv_unit_stride;
    const int64_t b = unit / s.heads_kv, kv_head = unit % s.heads_kv;
    return b * s.seq_k * s.heads_kv * s.head_dim + kv_head * s.head_dim;
  }
  int64_t stat_offset(int64_t unit, int64_t pass) const { return (unit * group + pass) * s.seq_q; }
};

// The device scratch of a call, carved from one workspace (base == nullptr only measures).
struct Scratch {
  float* scores = nullptr;    // S, then dP: float32
  void* probs = nullptr;      // P, then dS: the input dtype (hi when split)
  void* residuals = nullptr;  // split: their lo parts
  float* row_sum = nullptr;   // split: the chunk's rows of O or dQ, [unit][row][head_dim]
  float* row_dot = nullptr;   // backward: D_i, [batch, heads_q, seq_q]
  float* dk_sum = nullptr;    // backward, split: [units of a chunk][seq_k][head_dim]
  float* dv_sum = nullptr;
  std::size_t bytes = 0;

  Scratch(const Plan& plan, bool backward, void* base) {
    auto take = [&](std::size_t size) {  // 256-byte aligned: both P parts get the same GEMM plans
      void* at = base == nullptr ? nullptr : static_cast<char*>(base) + bytes;
      bytes += round_up(size);
      return at;
    };
    const Shape& s = plan.s;
    const std::size_t scores_count = plan.scores_per_chunk();
    scores = static_cast<float*>(take(scores_count * sizeof(float)));
    probs = take(scores_count * dtype_size(s.dtype));
    if (plan.split) {
      residuals = take(scores_count * dtype_size(s.dtype));
      row_sum = static_cast<float*>(
          take(static_cast<std::size_t>(plan.units_per_chunk * plan.rows_per_chunk * s.head_dim) * sizeof(float)));
    }
    if (!backward) return;
    row_dot = static_cast<float*>(take(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q) * sizeof(float)));
    if (plan.split) {
      const auto sum_bytes = static_cast<std::size_t>(plan.units_per_chunk * s.seq_k * s.head_dim) * sizeof(float);
      dk_sum = static_cast<float*>(take(sum_bytes));
      dv_sum = static_cast<float*>(take(sum_bytes));
    }
  }
};

// One chunk: `count` units from `unit` (one run), pass `pass`, their query rows [first_row, first_row + rows).
struct Chunk {
  int64_t count = 0, rows = 0, first_row = 0;
  int64_t q_offset = 0, kv_offset = 0, stat_offset = 0;  // of the chunk's first unit and row
};

// Calls visit(unit, count) for each block of units, in order.
template <typename Visit>
void for_each_unit_block(const Plan& plan, Visit visit) {
  for (int64_t unit = 0; unit < plan.units;) {
    const int64_t run_end = (unit / plan.run + 1) * plan.run;
    const int64_t count = std::min(plan.units_per_chunk, run_end - unit);
    visit(unit, count);
    unit += count;
  }
}

// Calls body(chunk) for each pass and row block of the units [unit, unit + count), in order.
template <typename Body>
void for_each_chunk(const Plan& plan, int64_t unit, int64_t count, Body body) {
  for (int64_t pass = 0; pass < plan.passes; ++pass) {
    for (int64_t row = 0; row < plan.rows; row += plan.rows_per_chunk) {
      Chunk chunk;
      chunk.count = count;
      chunk.rows = std::min(plan.rows_per_chunk, plan.rows - row);
      chunk.first_row = row;
      chunk.q_offset = plan.q_offset(unit, pass) + row * plan.q_pitch;
      chunk.kv_offset = plan.kv_offset(unit);
      chunk.stat_offset = plan.stat_offset(unit, pass) + row;
      body(chunk);
    }
  }
}

const void* at(const void* base, int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(dtype_size(dtype));
}
void* at(void* base, int64_t elements, DType dtype) {
  return static_cast<char*>(base) + elements * static_cast<int64_t>(dtype_size(dtype));
}

// ---- GEMMs (row-major; batch over the chunk's units) ---------------------------------------------------------
// Where a GEMM writes (or adds to): an output array in its own layout, or a float32 accumulator.
struct Target {
  void* base = nullptr;
  int64_t ld = 0, unit_stride = 0;
  DType dtype = DType::Float32;
};

// scores[unit] (rows x seq_k, float32) = alpha * lhs_rows (rows x head_dim) @ key_rows^T; lhs is Q or dO, keys K or V.
void scores_gemm(const Plan& plan, const Chunk& chunk, const void* lhs, const void* keys, float alpha, float* scores,
                 cudaStream_t stream) {
  GemmCall call;
  call.m = chunk.rows, call.n = plan.s.seq_k, call.k = plan.s.head_dim, call.batch = chunk.count;
  call.dtype = plan.s.dtype, call.c_dtype = DType::Float32, call.alpha = alpha;
  call.a = at(lhs, chunk.q_offset, plan.s.dtype), call.lda = plan.q_pitch, call.stride_a = plan.q_unit_stride;
  call.b = at(keys, chunk.kv_offset, plan.s.dtype), call.ldb = plan.kv_pitch, call.stride_b = plan.kv_unit_stride;
  call.trans_b = true;
  call.c = scores, call.ldc = plan.s.seq_k, call.stride_c = chunk.rows * plan.s.seq_k;
  batched_gemm(call, stream);
}

// target = alpha * P @ rhs + beta * target for the P (or dS) of the chunk in scratch, over its parts: the residual
// part adds with alpha / 2^t (top comment). rows_side: P is rows x seq_k and rhs key rows (seq_k x head_dim), the
// target rows x head_dim (O = P V, dQ = scale dS K); else P^T (seq_k x rows) @ rhs query rows (rows x head_dim), the
// target seq_k x head_dim (dV = P^T dO, dK = scale dS^T Q).
void probs_gemm(const Plan& plan, const Chunk& chunk, const Scratch& scratch, bool rows_side, const void* rhs,
                float alpha, float beta, const Target& target, cudaStream_t stream) {
  const Shape& s = plan.s;
  GemmCall call;
  call.m = rows_side ? chunk.rows : s.seq_k, call.n = s.head_dim, call.k = rows_side ? s.seq_k : chunk.rows;
  call.batch = chunk.count;
  call.dtype = s.dtype, call.c_dtype = target.dtype;
  call.lda = s.seq_k, call.stride_a = chunk.rows * s.seq_k, call.trans_a = !rows_side;
  if (rows_side) {
    call.b = at(rhs, chunk.kv_offset, s.dtype), call.ldb = plan.kv_pitch, call.stride_b = plan.kv_unit_stride;
  } else {
    call.b = at(rhs, chunk.q_offset, s.dtype), call.ldb = plan.q_pitch, call.stride_b = plan.q_unit_stride;
  }
  call.c = target.base, call.ldc = target.ld, call.stride_c = target.unit_stride;
  call.a = scratch.probs, call.alpha = alpha, call.beta = beta;
  batched_gemm(call, stream);
  if (!plan.split) return;
  call.a = scratch.residuals, call.alpha = alpha / residual_scale(s.dtype), call.beta = 1.0f;
  batched_gemm(call, stream);
}

// ---- row kernels: a block per score row ------------------------------------------------------------------------
// The score rows of a chunk: `units` x `rows`, seq_k apart. Row r of a unit is query row (first_row + r) % seq_q
// (bhsd units stack the group's heads) and its statistic is stats[unit * stat_unit_stride + r].
struct RowBlock {
  Shape s;  // the sizes, the mask (causal, window) and the soft cap
  int64_t rows = 0, first_row = 0, stat_unit_stride = 0;
  float residual_scale = 1.0f;
};

// The keys row r sees: [begin, end) (api.hpp).
struct KeyRange {
  int64_t begin, end;
};
__device__ __forceinline__ KeyRange visible_keys(const RowBlock& block, int64_t r) {
  const int64_t i = (block.first_row + r) % block.s.seq_q;
  return {block.s.key_begin(i), block.s.key_end(i)};
}

// A float32 value of P or dS stored as the GEMMs read it (whole for float32, hi and scaled lo parts for 16-bit
// storage), and read back.
template <typename T>
__device__ __forceinline__ void store_parts(const RowBlock& block, float value, int64_t index, T* hi, T* lo) {
  const T high = from_float<T>(value);
  hi[index] = high;
  if constexpr (!std::is_same_v<T, float>) lo[index] = from_float<T>((value - to_float(high)) * block.residual_scale);
}

template <typename T>
__device__ __forceinline__ float load_parts(const RowBlock& block, int64_t index, const T* hi, const T* lo) {
  if constexpr (std::is_same_v<T, float>) {
    return hi[index];
  } else {
    return to_float(hi[index]) + to_float(lo[index]) / block.residual_scale;
  }
}

// The scaled score as the softmax sees it: soft-capped (c tanh(s / c)) when the shape asks for it.
__device__ __forceinline__ float capped(const Shape& s, float score) {
  return s.softcap > 0.0f ? s.softcap * tanhf(score / s.softcap) : score;
}

// P = exp(S - lse), zero where masked. kSaveLse: the forward computes lse from S and writes it (+inf for a row
// with no visible key, whose P is then 0); else it is read.
template <bool kSaveLse, typename T, typename Stat>
__global__ void __launch_bounds__(kRowThreads)
    probabilities_kernel(RowBlock block, const float* __restrict__ scores, Stat* __restrict__ lse,
                         T* __restrict__ probs, T* __restrict__ residuals) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x, unit = row / block.rows, r = row % block.rows;
  const int64_t seq_k = block.s.seq_k;
  const float* score_row = scores + row * seq_k;
  Stat* stat = lse + unit * block.stat_unit_stride + r;
  const KeyRange visible = visible_keys(block, r);
  float row_lse;
  if constexpr (kSaveLse) {
    float local_max = -INFINITY, local_sum = 0.0f;  // online: local_sum is relative to local_max
    for (int64_t j = visible.begin + threadIdx.x; j < visible.end; j += blockDim.x) {
      const float x = capped(block.s, score_row[j]);
      if (x > local_max) {
        local_sum = local_sum * expf(local_max - x) + 1.0f;
        local_max = x;
      } else {
        local_sum += expf(x - local_max);
      }
    }
    const float row_max = block_reduce(local_max, MaxOp{}, scratch);
    const float rescaled = local_sum == 0.0f ? 0.0f : local_sum * expf(local_max - row_max);
    const float row_sum = block_reduce(rescaled, SumOp{}, scratch);
    row_lse = row_sum > 0.0f ? row_max + logf(row_sum) : INFINITY;
    if (threadIdx.x == 0) *stat = row_lse;
  } else {
    row_lse = *stat;
  }
  for (int64_t j = threadIdx.x; j < seq_k; j += blockDim.x) {
    const bool shown = j >= visible.begin && j < visible.end;
    store_parts(block, shown ? expf(capped(block.s, score_row[j]) - row_lse) : 0.0f, row * seq_k + j, probs,
                residuals);
  }
}

// dS = P (dP - D_i), written over P; with a soft cap also times 1 - t^2, t = tanh(s / c) = (ln P + lse) / c read
// back from P (dP has overwritten the scores; where P is 0, so is dS). Masked entries of P are zero, and so is their
// dS: they are left as they are.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    score_grad_kernel(RowBlock block, const float* __restrict__ dprobs, const float* __restrict__ row_dot,
                      const float* __restrict__ lse, T* __restrict__ probs, T* __restrict__ residuals) {
  const int64_t row = blockIdx.x, unit = row / block.rows, r = row % block.rows;
  const float d = row_dot[unit * block.stat_unit_stride + r];
  const float row_lse = lse[unit * block.stat_unit_stride + r];
  const KeyRange visible = visible_keys(block, r);
  for (int64_t j = visible.begin + threadIdx.x; j < visible.end; j += blockDim.x) {
    const int64_t index = row * block.s.seq_k + j;
    const float p = load_parts(block, index, probs, residuals);
    float ds = p * (dprobs[index] - d);
    if (block.s.softcap > 0.0f && p > 0.0f) {
      const float t = (logf(p) + row_lse) / block.s.softcap;
      ds *= 1.0f - t * t;
    }
    store_parts(block, ds, index, probs, residuals);
  }
}

// D_i = dO_i . O_i for every query row ([batch, heads_q, seq_q]), a warp per row.
template <typename T>
__global__ void row_dot_kernel(Shape s, const T* __restrict__ dout, const T* __restrict__ o,
                               float* __restrict__ row_dot) {
  const int lane = threadIdx.x & 31;
  const int64_t total = s.batch * s.heads_q * s.seq_q;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < total; row += warps) {
    const int64_t i = row % s.seq_q, bh = row / s.seq_q, b = bh / s.heads_q, h = bh % s.heads_q;
    const int64_t offset = (s.seq_major ? (b * s.seq_q + i) * s.heads_q + h : row) * s.head_dim;
    float partial = 0.0f;
    for (int64_t d = lane; d < s.head_dim; d += 32) partial += to_float(dout[offset + d]) * to_float(o[offset + d]);
    partial = warp_reduce(partial, SumOp{});
    if (lane == 0) row_dot[row] = partial;
  }
}

// `count` packed float32 matrices of rows x cols ([unit][row][col]), rounded into a strided array (row pitch and
// unit stride in elements, dst at the first unit's first row): O, dQ of a chunk, dK, dV of a block of units.
template <typename T>
__global__ void store_rows_kernel(int64_t count, int64_t rows, int64_t cols, int64_t pitch, int64_t unit_stride,
                                  const float* __restrict__ src, T* __restrict__ dst) {
  const int64_t total = count * rows * cols;
  for (int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; index < total;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = index % cols, row = (index / cols) % rows, unit = index / (cols * rows);
    dst[unit * unit_stride + row * pitch + col] = from_float<T>(src[index]);
  }
}

RowBlock row_block(const Plan& plan, const Chunk& chunk) {
  RowBlock block;
  block.s = plan.s;
  block.rows = chunk.rows, block.first_row = chunk.first_row, block.stat_unit_stride = plan.stat_unit_stride;
  block.residual_scale = residual_scale(plan.s.dtype);
  return block;
}

// A block per score row, no wider than the row needs.
int row_threads(int64_t seq_k) { return static_cast<int>(std::min<int64_t>(kRowThreads, divide_up(seq_k, 32) * 32)); }

unsigned grid_stride_blocks(int64_t items, int per_block) {
  return static_cast<unsigned>(std::min<int64_t>(divide_up(items, per_block), 132 * 16));
}

// Stat: float (the forward writes lse) or const float (the backward reads it).
template <bool kSaveLse, typename Stat>
void launch_probabilities(const Plan& plan, const Chunk& chunk, const Scratch& scratch, Stat* lse,
                          cudaStream_t stream) {
  const auto rows = static_cast<unsigned>(chunk.count * chunk.rows);
  GE2_DISPATCH_FLOATING(plan.s.dtype, "dtype",
                        probabilities_kernel<kSaveLse, scalar_t, Stat><<<rows, row_threads(plan.s.seq_k), 0, stream>>>(
                            row_block(plan, chunk), scratch.scores, lse + chunk.stat_offset,
                            static_cast<scalar_t*>(scratch.probs), static_cast<scalar_t*>(scratch.residuals)));
  GE2_CHECK_LAUNCH("attention unfused softmax");
}

void store_rows(const Plan& plan, int64_t count, int64_t rows, int64_t pitch, int64_t unit_stride, const float* src,
                void* dst, cudaStream_t stream) {
  const int64_t items = count * rows * plan.s.head_dim;
  GE2_DISPATCH_FLOATING(plan.s.dtype, "dtype",
                        store_rows_kernel<scalar_t><<<grid_stride_blocks(items, 256), 256, 0, stream>>>(
                            count, rows, plan.s.head_dim, pitch, unit_stride, src, static_cast<scalar_t*>(dst)));
  GE2_CHECK_LAUNCH("attention unfused store");
}

// O = P V or dQ = scale dS K for a chunk: straight into `out` (float32), or through the float32 row sums (split).
void rows_product(const Plan& plan, const Chunk& chunk, const Scratch& scratch, const void* keys, float alpha,
                  void* out, cudaStream_t stream) {
  if (!plan.split) {
    const Target target{at(out, chunk.q_offset, plan.s.dtype), plan.q_pitch, plan.q_unit_stride, plan.s.dtype};
    probs_gemm(plan, chunk, scratch, /*rows_side=*/true, keys, alpha, 0.0f, target, stream);
    return;
  }
  const Target row_sum{scratch.row_sum, plan.s.head_dim, chunk.rows * plan.s.head_dim, DType::Float32};
  probs_gemm(plan, chunk, scratch, /*rows_side=*/true, keys, alpha, 0.0f, row_sum, stream);
  store_rows(plan, chunk.count, chunk.rows, plan.q_pitch, plan.q_unit_stride, scratch.row_sum,
             at(out, chunk.q_offset, plan.s.dtype), stream);
}

}  // namespace

std::size_t unfused_workspace_bytes(const Shape& shape, bool backward) {
  return Scratch(Plan(shape), backward, nullptr).bytes;
}

void launch_unfused_forward(const ForwardArgs& args, void* workspace, cudaStream_t stream) {
  const Plan plan(args.shape);
  const Scratch scratch(plan, /*backward=*/false, workspace);
  for_each_unit_block(plan, [&](int64_t unit, int64_t count) {
    for_each_chunk(plan, unit, count, [&](const Chunk& chunk) {
      scores_gemm(plan, chunk, args.q, args.k, args.shape.scale, scratch.scores, stream);
      launch_probabilities<true>(plan, chunk, scratch, args.lse, stream);
      rows_product(plan, chunk, scratch, args.v, 1.0f, args.o, stream);
    });
  });
}

void launch_unfused_backward(const BackwardArgs& args, void* workspace, cudaStream_t stream) {
  const Shape& s = args.shape;
  const Plan plan(s);
  const Scratch scratch(plan, /*backward=*/true, workspace);
  const int64_t query_rows = s.batch * s.heads_q * s.seq_q;
  GE2_DISPATCH_FLOATING(s.dtype, "dtype",
                        row_dot_kernel<scalar_t><<<grid_stride_blocks(query_rows, 8), 256, 0, stream>>>(
                            s, static_cast<const scalar_t*>(args.dout), static_cast<const scalar_t*>(args.o),
                            scratch.row_dot));
  GE2_CHECK_LAUNCH("attention unfused row_dot");

  for_each_unit_block(plan, [&](int64_t unit, int64_t count) {
    void* dk = at(args.dk, plan.kv_offset(unit), s.dtype);
    void* dv = at(args.dv, plan.kv_offset(unit), s.dtype);
    // split: float32 sums of the block's units, rounded once at the end; else the arrays themselves
    const Target dk_target = plan.split ? Target{scratch.dk_sum, s.head_dim, s.seq_k * s.head_dim, DType::Float32}
                                        : Target{dk, plan.kv_pitch, plan.kv_unit_stride, s.dtype};
    const Target dv_target = plan.split ? Target{scratch.dv_sum, s.head_dim, s.seq_k * s.head_dim, DType::Float32}
                                        : Target{dv, plan.kv_pitch, plan.kv_unit_stride, s.dtype};
    bool first = true;  // the first GEMM into the units' dK, dV overwrites, later ones add (beta = 1)
    for_each_chunk(plan, unit, count, [&](const Chunk& chunk) {
      const float beta = first ? 0.0f : 1.0f;
      first = false;
      scores_gemm(plan, chunk, args.q, args.k, s.scale, scratch.scores, stream);
      launch_probabilities<false>(plan, chunk, scratch, args.lse, stream);
      probs_gemm(plan, chunk, scratch, /*rows_side=*/false, args.dout, 1.0f, beta, dv_target, stream);
      scores_gemm(plan, chunk, args.dout, args.v, 1.0f, scratch.scores, stream);  // dP, over S
      GE2_DISPATCH_FLOATING(s.dtype, "dtype",
                            score_grad_kernel<scalar_t><<<static_cast<unsigned>(chunk.count * chunk.rows),
                                                          row_threads(s.seq_k), 0, stream>>>(
                                row_block(plan, chunk), scratch.scores, scratch.row_dot + chunk.stat_offset,
                                args.lse + chunk.stat_offset, static_cast<scalar_t*>(scratch.probs),
                                static_cast<scalar_t*>(scratch.residuals)));
      GE2_CHECK_LAUNCH("attention unfused softmax backward");
      rows_product(plan, chunk, scratch, args.k, s.scale, args.dq, stream);
      probs_gemm(plan, chunk, scratch, /*rows_side=*/false, args.q, s.scale, beta, dk_target, stream);
    });
    if (!plan.split) return;
    store_rows(plan, count, s.seq_k, plan.kv_pitch, plan.kv_unit_stride, scratch.dk_sum, dk, stream);
    store_rows(plan, count, s.seq_k, plan.kv_pitch, plan.kv_unit_stride, scratch.dv_sum, dv, stream);
  });
}

}  // namespace ge2::attention
