// implicit_gemm: GE2's own conv2d forward on tensor cores, NHWC, float16/bfloat16 in, float32 accumulation, no
// im2col buffer. GEMM view: M = N*P*Q output pixels, N = K output channels, reduction = R*S*C taken as R*S*ceil(C/64)
// tiles of 64 channels. Each block computes a BM x BN tile of y; the A tile (BM pixels x 64 channels of one filter
// tap) is gathered from x on the fly with 16-byte cp.async (padding, stride and dilation decided per vector; outside
// the input, past C or past M the copy reads 0 bytes and zero-fills), the B tile (BN filters x 64 channels) comes
// from w [K, R, S, C]. Multi-stage cp.async pipeline in XOR-swizzled shared memory, ldmatrix.x4 fragments,
// mma.sync m16n8k16, and an epilogue that adds the bias and the residual, applies the activation, stages the tile in
// shared memory and writes y in 16-byte rows.
//
// The tile shape is a template; kConfigs below instantiates a few. A launch takes the one choose_config() picks
// (the H100 sweep's rule), or the one GE2_IMPLICIT_GEMM_CONFIG=<index> names (read per launch, so a benchmark or a
// test can time or check every config in one process).
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "api.hpp"
#include "cp_async.hpp"
#include "fast_divmod.hpp"
#include "status.hpp"

namespace ge2::conv2d {
namespace {

constexpr int kTileK = 64;             // channels per reduction tile: 8 vectors of 8 halves, a 128-byte smem row
constexpr int kChunks = kTileK / 8;    // 16-byte vectors per smem row
constexpr const char* kConfigVariable = "GE2_IMPLICIT_GEMM_CONFIG";

struct Params {
  const void* x;
  const void* w;
  const void* bias;      // nullptr: none
  const void* residual;  // nullptr: none; else [M][K] as y
  void* y;
  int h, w_in, c, k, r, s;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  FastDivmod q_divider, p_divider;  // output pixel -> (image, p, q)
  int m;             // N * P * Q
  int channel_tiles; // ceil(C / 64)
  int k_tiles;       // R * S * channel_tiles
  // The reduction walk's steps of the tap offset, in 16-byte vectors: to the next filter column (x_step_s) or row
  // (x_step_r) in x, to the next tap in w, each from the tap's last channel tile back to channel 0. Modulo 2^32
  // (a step may be negative): the offsets of vectors inside x and w are below 2^30, so they come out exact.
  unsigned x_step_s, x_step_r, w_step_tap;
  int n_tiles;       // ceil(K / BN): the fast index of the 1-d grid (neighbouring blocks share their x tile)
  Act act;
  float slope;
  float clip_low, clip_high;  // the clip after the activation (infinite: none)
  bool vector_store; // K % 8 == 0 and y 16-byte aligned: the epilogue writes 16-byte vectors
};

// Swizzled element offset of 16-byte vector `chunk` in row `row` of a [rows][64] tile: a 128-byte row spans all 32
// banks, so the 8 rows an ldmatrix reads at one logical chunk would share 4 banks; XOR-ing the chunk with row % 8
// spreads them over all 8 chunk positions.
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * kTileK + ((chunk ^ (row & 7)) << 3);
}

// base + 16 * vector in one multiply-add. As asm, the select that zeroes an invalid vector stays a 32-bit select
// before it: written in C++, the compiler moved it past the widening and selected both halves of the address.
__device__ __forceinline__ uint64_t vector_address(uint64_t base, unsigned vector) {
  uint64_t address;
  asm("mad.wide.u32 %0, %1, 16, %2;\n" : "=l"(address) : "r"(vector), "l"(base));
  return address;
}

// volatile keeps the shared-memory read between the barriers that guard it.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&fragment)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(address));
}

// Not volatile: a pure register operation, which the compiler may schedule among the next step's ldmatrix.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
struct Pair;
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// Shared memory of one config: the pipeline's stages, reused by the epilogue's output tile.
template <typename T, int BM, int BN, int Stages>
constexpr std::size_t shared_bytes_of() {
  return std::size_t(Stages) * (BM + BN) * kTileK * sizeof(T);
}

// BM x BN block tile, WarpsM x WarpsN warps (each a (BM / WarpsM) x (BN / WarpsN) tile of m16n8 MMAs), a
// Stages-deep cp.async pipeline; MinBlocks CTAs per SM is the occupancy the config is sized for (its shared memory
// allows that many), which caps the registers (see kConfigs).
// Prefetch picks the main loop: false, the first one (per k-tile: wait, barrier, refill, then ldmatrix + mma of
// the tile); true, the barrier comes before the tile's last k16 step, so that step's MMAs overlap the barrier, the
// refill and the first ldmatrix of the next tile (CUTLASS's multistage order; all Stages stages hold loads).
// ThroughL1: the x gather goes through L1 (cp.async.ca): a 3x3 layer's consecutive taps read nearly the same
// lines (the window moves by one pixel or one row), so L1 serves what L2 would otherwise send again.
template <typename T, int BM, int BN, int WarpsM, int WarpsN, int Stages, int MinBlocks, bool Prefetch,
          bool ThroughL1>
__global__ void __launch_bounds__(WarpsM * WarpsN * 32, MinBlocks)
    implicit_gemm_kernel(const Params params) {
  constexpr int kThreads = WarpsM * WarpsN * 32;
  constexpr int kWarpM = BM / WarpsM, kWarpN = BN / WarpsN;
  constexpr int kMmaM = kWarpM / 16, kMmaN = kWarpN / 8;
  // Loads: thread t moves chunk t % 8 of rows t / 8 + i * kRowsPerPass, so the chunk (and with it the swizzle, as
  // kRowsPerPass is a multiple of 8) is the same for every vector it loads.
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kVectorsA = (BM + kRowsPerPass - 1) / kRowsPerPass;
  constexpr int kVectorsB = (BN + kRowsPerPass - 1) / kRowsPerPass;
  // Whether the last pass of loads runs past the tile (192 threads, BN = 64): only then do rows need a check.
  constexpr bool kPartialA = kVectorsA * kRowsPerPass != BM, kPartialB = kVectorsB * kRowsPerPass != BN;
  constexpr int kStageA = BM * kTileK, kStageB = BN * kTileK;  // elements per stage
  constexpr unsigned kStageBytesA = kStageA * sizeof(T), kStageBytesB = kStageB * sizeof(T);
  constexpr unsigned kPassBytes = kRowsPerPass * kTileK * sizeof(T), kMmaRowsBytes = 16 * kTileK * sizeof(T);
  static_assert(kMmaN % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
  static_assert(kWarpM % 16 == 0, "A fragments are m16 tiles");
  static_assert(kRowsPerPass % 8 == 0, "a thread's rows share their swizzle");
  constexpr int kOutPitch = BN + 8;  // 16 bytes of padding: the 8 rows of an accumulator store hit distinct banks
  constexpr int kOutVectors = BM * BN / 8;
  static_assert(BN % 8 == 0 && kOutVectors % kThreads == 0, "whole 16-byte output vectors per thread");
  static_assert(std::size_t(BM) * kOutPitch * sizeof(T) <= shared_bytes_of<T, BM, BN, Stages>(),
                "the output tile fits in the pipeline's shared memory");

  extern __shared__ __align__(128) unsigned char shared_bytes[];
  T* tiles_a = reinterpret_cast<T*>(shared_bytes);  // [Stages][BM][64]
  T* tiles_b = tiles_a + Stages * kStageA;          // [Stages][BN][64]

  // Addresses as integers: with pointers, the compiler folds a tile's tap offset into every vector's own address
  // (one merged index per vector) instead of adding the vector's offset to the tap's address.
  const uint64_t x = reinterpret_cast<uint64_t>(params.x), w = reinterpret_cast<uint64_t>(params.w);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WarpsN, warp_n = warp % WarpsN;
  const int block_n = (blockIdx.x % params.n_tiles) * BN;
  const int block_m = (blockIdx.x / params.n_tiles) * BM;

  // Per row this thread loads, what the reduction walk does not change: the offset in x of its output pixel's window
  // corner at this thread's channel chunk, in 16-byte vectors (32 bits: x stays below 2^33 elements), and which
  // filter taps land inside x (bit r: filter row r, bit 16 + s: filter column s; R, S <= 16), so that the bounds
  // check of a tap is one AND. Rows past M (or past BM when BM is not a whole number of passes) have no valid tap.
  const int chunk = tid % kChunks, first_row = tid / kChunks;
  int a_offset[kVectorsA];
  unsigned a_taps[kVectorsA];
#pragma unroll
  for (int i = 0; i < kVectorsA; ++i) {
    const int row = first_row + i * kRowsPerPass;
    const int pixel = block_m + row;
    a_offset[i] = 0;
    a_taps[i] = 0;
    if ((!kPartialA || row < BM) && pixel < params.m) {
      uint32_t q = 0, p = 0;
      const uint32_t image = params.p_divider.divmod(params.q_divider.divmod(static_cast<uint32_t>(pixel), q), p);
      const int top = static_cast<int>(p) * params.stride_h - params.pad_top;
      const int left = static_cast<int>(q) * params.stride_w - params.pad_left;
      for (int r = 0; r < params.r; ++r) {
        if (static_cast<unsigned>(top + r * params.dilation_h) < static_cast<unsigned>(params.h)) a_taps[i] |= 1u << r;
      }
      for (int s = 0; s < params.s; ++s) {
        if (static_cast<unsigned>(left + s * params.dilation_w) < static_cast<unsigned>(params.w_in)) {
          a_taps[i] |= 1u << (16 + s);
        }
      }
      a_offset[i] = static_cast<int>(
          ((static_cast<int64_t>(image) * params.h + top) * params.w_in + left) * (params.c / 8) + chunk);
    }
  }
  // A thread's filters are kRowsPerPass apart, so one offset and a multiple of the filter pitch locate them all.
  // Offsets in w are in 16-byte vectors too (K*R*S*C < 2^30); unsigned, as a row past K may wrap (never loaded).
  const int first_filter = block_n + first_row;
  const unsigned filter_vectors = static_cast<unsigned>(params.r * params.s) * (params.c / 8);
  const unsigned w_thread = static_cast<unsigned>(first_filter) * filter_vectors + chunk;
  const unsigned load_a = smem_address(tiles_a + tile_offset(first_row, chunk));
  const unsigned load_b = smem_address(tiles_b + tile_offset(first_row, chunk));

  // Reduction tile kt = (tap_r * S + tap_s) * channel_tiles + channel_tile, walked in order by the loads. The tap's
  // displacement in x and in w (16-byte vectors, 32 bits) moves by a constant per step (a channel tile, a filter
  // column, a filter row: Params' steps), so a refill does no 64-bit arithmetic but one multiply-add per vector,
  // and a vector costs one AND, one compare, one add and one select besides. Unsigned: modulo 2^32, exact where the
  // vector is loaded (a corner outside x has a negative offset; a tap outside every window, a large one).
  int load_r = 0, load_s = 0, load_channel_tile = 0, load_stage = 0;
  unsigned x_tap = 0;           // (dh * W + dw) * C / 8 + channel0 / 8
  unsigned w_tap = w_thread;    // w_thread + ((r * S + s) * C + channel0) / 8
  auto load_tile = [&]() {
    const bool channel_ok = load_channel_tile * kTileK + chunk * 8 < params.c;
    const unsigned tap = (1u << load_r) | (1u << (16 + load_s));
    const unsigned stage_a = load_a + load_stage * kStageBytesA, stage_b = load_b + load_stage * kStageBytesB;
#pragma unroll
    for (int i = 0; i < kVectorsA; ++i) {
      if (kPartialA && first_row + i * kRowsPerPass >= BM) break;
      const bool valid = channel_ok && (a_taps[i] & tap) == tap;
      const unsigned vector = valid ? static_cast<unsigned>(a_offset[i]) + x_tap : 0u;
      cp_async_16<ThroughL1>(stage_a + i * kPassBytes, vector_address(x, vector), valid);
    }
#pragma unroll
    for (int i = 0; i < kVectorsB; ++i) {
      if (kPartialB && first_row + i * kRowsPerPass >= BN) break;
      const bool valid = channel_ok && first_filter + i * kRowsPerPass < params.k;
      const unsigned vector = valid ? w_tap + i * kRowsPerPass * filter_vectors : 0u;
      cp_async_16(stage_b + i * kPassBytes, vector_address(w, vector), valid);
    }
    if (++load_stage == Stages) load_stage = 0;
    if (++load_channel_tile < params.channel_tiles) {
      x_tap += kChunks;
      w_tap += kChunks;
    } else {
      load_channel_tile = 0;
      w_tap += params.w_step_tap;
      if (++load_s < params.s) {
        x_tap += params.x_step_s;
      } else {
        load_s = 0;
        ++load_r;
        x_tap += params.x_step_r;
      }
    }
  };

  float acc[kMmaM][kMmaN][4];
#pragma unroll
  for (int i = 0; i < kMmaM; ++i) {
#pragma unroll
    for (int j = 0; j < kMmaN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }

  // ldmatrix lanes: A (x4 = a 16x16 tile): lane -> row lane % 16, chunk lane / 16 of the k16 step. B (x4 = two n8
  // tiles x k16): lane -> row lane % 8 + (lane / 16) * 8, chunk (lane / 8) % 2. Rows i * 16 apart share a swizzle.
  const int a_row = warp_m * kWarpM + (lane & 15), a_chunk = lane >> 4;
  const int b_row = warp_n * kWarpN + (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;
  const unsigned read_a = smem_address(tiles_a + a_row * kTileK), read_b = smem_address(tiles_b + b_row * kTileK);
  const int a_swizzle = a_row & 7, b_swizzle = b_row & 7;
  using FragmentsA = unsigned[kMmaM][4];
  using FragmentsB = unsigned[kMmaN / 2][4];
  // The fragments of k16 step `k16` of the tile in stage `stage`.
  auto load_fragments = [&](FragmentsA& a, FragmentsB& b, int stage, int k16) {
    const unsigned stage_a = read_a + stage * kStageBytesA, stage_b = read_b + stage * kStageBytesB;
    const unsigned a_column = ((k16 * 2 + a_chunk) ^ a_swizzle) * 16;  // bytes: 16-byte chunks
    const unsigned b_column = ((k16 * 2 + b_chunk) ^ b_swizzle) * 16;
#pragma unroll
    for (int i = 0; i < kMmaM; ++i) ldmatrix_x4(a[i], stage_a + a_column + i * kMmaRowsBytes);
#pragma unroll
    for (int j = 0; j < kMmaN / 2; ++j) ldmatrix_x4(b[j], stage_b + b_column + j * kMmaRowsBytes);
  };
  auto multiply = [&](const FragmentsA& a, const FragmentsB& b) {
#pragma unroll
    for (int i = 0; i < kMmaM; ++i) {
#pragma unroll
      for (int j = 0; j < kMmaN; ++j) mma_16816<T>(acc[i][j], a[i], b[j / 2][(j % 2) * 2], b[j / 2][(j % 2) * 2 + 1]);
    }
  };
  constexpr int kSteps = kTileK / 16;

  if constexpr (!Prefetch) {
#pragma unroll
    for (int stage = 0; stage < Stages - 1; ++stage) {
      if (stage < params.k_tiles) load_tile();
      cp_async_commit();  // an empty group past the end keeps the wait counts uniform
    }
    int read_stage = 0;
    for (int kt = 0; kt < params.k_tiles; ++kt) {
      cp_async_wait<Stages - 2>();
      __syncthreads();  // tile kt is visible to all, and every warp is done with the stage refilled below
      if (kt + Stages - 1 < params.k_tiles) load_tile();
      cp_async_commit();
#pragma unroll
      for (int k16 = 0; k16 < kSteps; ++k16) {
        FragmentsA a;
        FragmentsB b;
        load_fragments(a, b, read_stage, k16);
        multiply(a, b);
      }
      if (++read_stage == Stages) read_stage = 0;
    }
  } else {
    // All Stages stages start loading (tiles 0 .. Stages - 1). The groups committed before the wait in tile kt are
    // Stages + kt (prologue, then one per earlier tile): waiting down to Stages - 2 pending completes tiles
    // 0 .. kt + 1.
    static_assert(kSteps % 2 == 0, "the fragment double buffer alternates per k16 step");
#pragma unroll
    for (int stage = 0; stage < Stages; ++stage) {
      if (stage < params.k_tiles) load_tile();
      cp_async_commit();  // an empty group past the end keeps the wait counts uniform
    }
    cp_async_wait<Stages - 1>();
    __syncthreads();  // tile 0 is visible to all
    FragmentsA a[2];
    FragmentsB b[2];
    int read_stage = 0;
    load_fragments(a[0], b[0], read_stage, 0);
    for (int kt = 0; kt < params.k_tiles; ++kt) {
#pragma unroll
      for (int k16 = 0; k16 < kSteps; ++k16) {
        if (k16 == kSteps - 1) {
          // Every warp has its last fragments of tile kt in registers (read in the step before), so after this
          // barrier its stage takes tile kt + Stages; tile kt + 1 is visible to all.
          cp_async_wait<Stages - 2>();
          __syncthreads();
          if (kt + Stages < params.k_tiles) load_tile();
          cp_async_commit();
          if (++read_stage == Stages) read_stage = 0;
        }
        // Fragments for the next step (the next tile's first one after the barrier) before this step's MMAs.
        if (k16 + 1 < kSteps || kt + 1 < params.k_tiles) {
          load_fragments(a[(k16 + 1) % 2], b[(k16 + 1) % 2], read_stage, (k16 + 1) % kSteps);
        }
        multiply(a[k16 % 2], b[k16 % 2]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done reading the stages: the output tile reuses their memory

  // Epilogue, first half: accumulator element e of tile (i, j) is y[row + (e / 2) * 8][col + e % 2], row = lane / 4
  // within the m16 tile, col = 2 * (lane % 4) within the n8 tile; bias, residual and activation in float32, then
  // the pair goes to the [BM][BN + 8] output tile in y's dtype (rounded once). The residual is read element by
  // element (a pair may straddle a 4-byte boundary when K is odd).
  const T* bias = static_cast<const T*>(params.bias);
  const T* residual = static_cast<const T*>(params.residual);
  T* tile_y = reinterpret_cast<T*>(shared_bytes);
#pragma unroll
  for (int j = 0; j < kMmaN; ++j) {
    const int col = warp_n * kWarpN + j * 8 + (lane & 3) * 2;
    const bool has_bias = bias != nullptr && block_n + col < params.k;
    const float bias0 = has_bias ? to_float(bias[block_n + col]) : 0.0f;
    const float bias1 = has_bias && block_n + col + 1 < params.k ? to_float(bias[block_n + col + 1]) : 0.0f;
#pragma unroll
    for (int i = 0; i < kMmaM; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m * kWarpM + i * 16 + (lane >> 2) + half * 8;
        float z0 = acc[i][j][half * 2] + bias0, z1 = acc[i][j][half * 2 + 1] + bias1;
        if (residual != nullptr && block_m + row < params.m) {
          const T* r = residual + static_cast<int64_t>(block_m + row) * params.k + block_n + col;
          if (block_n + col < params.k) z0 += to_float(r[0]);
          if (block_n + col + 1 < params.k) z1 += to_float(r[1]);
        }
        const float v0 = clip_value(apply_act(params.act, z0, params.slope), params.clip_low, params.clip_high);
        const float v1 = clip_value(apply_act(params.act, z1, params.slope), params.clip_low, params.clip_high);
        *reinterpret_cast<typename Pair<T>::type*>(tile_y + row * kOutPitch + col) = Pair<T>::make(v0, v1);
      }
    }
  }
  __syncthreads();

  // Second half: 8 consecutive threads write 128 contiguous bytes of a y row (y is [M][K], NHWC), 16 bytes each;
  // element by element where K or y's address does not allow 16-byte vectors.
  T* y = static_cast<T*>(params.y);
#pragma unroll
  for (int i = 0; i < kOutVectors / kThreads; ++i) {
    const int vector = tid + i * kThreads;
    const int row = vector / (BN / 8), col = vector % (BN / 8) * 8;
    const int pixel = block_m + row, channel = block_n + col;
    if (pixel >= params.m || channel >= params.k) continue;
    const T* src = tile_y + row * kOutPitch + col;
    T* out = y + static_cast<int64_t>(pixel) * params.k + channel;
    if (params.vector_store) {
      *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8 && channel + e < params.k; ++e) out[e] = src[e];
    }
  }
}

// Opts the kernel into its dynamic shared memory (above 48 KiB a kernel must, once per device), then launches it.
template <typename T, int BM, int BN, int WarpsM, int WarpsN, int Stages, int MinBlocks, bool Prefetch,
          bool ThroughL1>
void launch_tile(const Params& params, int device, cudaStream_t stream) {
  constexpr int kThreads = WarpsM * WarpsN * 32;
  constexpr std::size_t kSharedBytes = shared_bytes_of<T, BM, BN, Stages>();
  auto kernel = implicit_gemm_kernel<T, BM, BN, WarpsM, WarpsN, Stages, MinBlocks, Prefetch, ThroughL1>;
  static std::atomic<uint64_t> opted_in{0};
  const uint64_t bit = uint64_t(1) << (device % 64);
  if ((opted_in.load() & bit) == 0) {
    GE2_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSharedBytes)));
    opted_in.fetch_or(bit);
  }
  Params tiled = params;
  tiled.n_tiles = (params.k + BN - 1) / BN;
  const int64_t blocks = static_cast<int64_t>(tiled.n_tiles) * ((params.m + BM - 1) / BM);
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream>>>(tiled);
  GE2_CHECK_LAUNCH("implicit_gemm");
}

using LaunchFn = void (*)(const Params&, int, cudaStream_t);

struct Config {
  int bm, bn, warps_m, warps_n, stages, min_blocks;
  bool prefetch, through_l1;
  LaunchFn half, bfloat16;
};

template <int BM, int BN, int WarpsM, int WarpsN, int Stages, int MinBlocks, bool Prefetch = false,
          bool ThroughL1 = false>
constexpr Config make_config() {
  return {BM, BN, WarpsM, WarpsN, Stages, MinBlocks, Prefetch, ThroughL1,
          launch_tile<__half, BM, BN, WarpsM, WarpsN, Stages, MinBlocks, Prefetch, ThroughL1>,
          launch_tile<__nv_bfloat16, BM, BN, WarpsM, WarpsN, Stages, MinBlocks, Prefetch, ThroughL1>};
}

// The candidate tile shapes, all with 64-channel reduction tiles and warp tiles of at least 32 x 32 (smaller ones
// would spend more shared-memory bandwidth on ldmatrix than the tensor cores can use). Shared memory per CTA is
// Stages * (BM + BN) * 128 bytes; MinBlocks is what that allows on an H100 (228 KB per SM, 1 KB of it reserved per
// CTA), which also caps the registers: each of the 4 SM sub-partitions has 16K for its share of the warps
// (ceil(MinBlocks * warps / 4)), in steps of 8 per thread.
//   0: 128 x 64, 4 warps of 64 x 32, 3 stages, 72 KB: 3 CTAs per SM (the narrow K = 64 layers)
//   1: 128 x 128, 8 warps of 64 x 32, 3 stages, 96 KB: 2 CTAs per SM (K >= 128 with M large enough)
//   2: 192 x 64, 6 warps of 64 x 32, 3 stages, 96 KB: 2 CTAs per SM (fills 132 SMs where 128-row tiles leave a
//      half-empty wave: M = 6272, K = 256 makes exactly 132 CTAs)
//   3: 256 x 64, 8 warps of 64 x 32, 3 stages, 120 KB: 1 CTA per SM (fewer B reloads at K = 64)
//   4: 64 x 64, 4 warps of 32 x 32, 4 stages, 64 KB: 3 CTAs per SM (small M with a long reduction)
//   5: 128 x 128, 4 warps of 64 x 64, 3 stages, 96 KB: 2 CTAs per SM (the fewest ldmatrix per mma)
// After the first sweep (small tiles and many CTAs per SM won; the 64 x 64 tiles move 0.031 bytes of x and w per
// flop, so at the ~170 TFLOP/s they reached they already pull ~5 TB/s through L2), each with the prefetching main
// loop:
//   6: config 4 with the prefetching loop (x through L2 only): the loop's own effect
//   7: config 6 with x through L1: the 9 taps of a 3x3 layer re-read nearly the same lines of x
//   8: 64 x 64, 4 warps of 32 x 32, 3 stages, 48 KB: 4 CTAs per SM (16 warps; 128 registers at most)
//   9: 128 x 64, 8 warps of 32 x 32, 4 stages, 96 KB: 2 CTAs per SM (16 warps; a quarter less L2 traffic per
//      flop than 64 x 64 with config 4's warp tiles)
//  10: 64 x 128, 4 warps of 32 x 64, 3 stages, 72 KB: 3 CTAs per SM (K >= 128; 6 ldmatrix per 16 mma instead of
//      8 per 16; a quarter less L2 traffic per flop)
// (96 x 64 with 6 warps of 32 x 32 at 3 CTAs per SM does not fit: 5 warps per SM sub-partition leave 96 registers,
// and it spilled.)
constexpr Config kConfigs[] = {
    make_config<128, 64, 2, 2, 3, 3>(),
    make_config<128, 128, 2, 4, 3, 2>(),
    make_config<192, 64, 3, 2, 3, 2>(),
    make_config<256, 64, 4, 2, 3, 1>(),
    make_config<64, 64, 2, 2, 4, 3>(),
    make_config<128, 128, 2, 2, 3, 2>(),
    make_config<64, 64, 2, 2, 4, 3, true, false>(),
    make_config<64, 64, 2, 2, 4, 3, true, true>(),
    make_config<64, 64, 2, 2, 3, 4, true, true>(),
    make_config<128, 64, 4, 2, 4, 2, true, true>(),
    make_config<64, 128, 2, 2, 3, 3, true, true>(),
};
constexpr int kConfigCount = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));

// The launch rule, from the H100 sweep (benchmarks/sweep_implicit_gemm.py, CUDA-graph replay, float16 NHWC, the
// five ResNet-50 rows at N = 32): 128 x 64 tiles of 8 warps (config 9) where they make at least 2.5 waves of CTAs
// (the two rows with M = 100352: 0.65x and 0.69x PyTorch, against 0.57x and 0.63x for config 4), else 64 x 64 tiles
// of 4 warps (config 4: 0.42-0.60x on the other rows, where config 9's last wave runs part-empty and it fell to
// 0.34-0.53x).
constexpr int kLargeProblemConfig = 9;
constexpr int kSmallProblemConfig = 4;

int sm_count(int device) {
  static std::atomic<int> counts[64] = {};
  std::atomic<int>& cached = counts[device % 64];
  int count = cached.load();
  if (count == 0) {
    GE2_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached.store(count);
  }
  return count;
}

int choose_config(const Params& params, int device) {
  const Config& large = kConfigs[kLargeProblemConfig];
  const int64_t ctas = (int64_t{params.m} + large.bm - 1) / large.bm * ((int64_t{params.k} + large.bn - 1) / large.bn);
  const int64_t wave = int64_t{large.min_blocks} * sm_count(device);
  return 2 * ctas >= 5 * wave ? kLargeProblemConfig : kSmallProblemConfig;
}

// GE2_IMPLICIT_GEMM_CONFIG as a config index, or -1 when unset.
int forced_config() {
  const char* value = std::getenv(kConfigVariable);
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long index = std::strtol(value, &end, 10);
  if (*end != '\0' || index < 0 || index >= kConfigCount) {
    throw std::invalid_argument(std::string(kConfigVariable) + ": expected a config index 0.." +
                                std::to_string(kConfigCount - 1) + ", got '" + value + "'");
  }
  return static_cast<int>(index);
}

Params make_params(const ForwardArgs& args) {
  const Shape& s = args.shape;
  Params params{};
  params.x = args.x, params.w = args.w, params.bias = args.bias, params.residual = args.residual, params.y = args.y;
  params.h = static_cast<int>(s.h), params.w_in = static_cast<int>(s.w);
  params.c = static_cast<int>(s.c), params.k = static_cast<int>(s.k), params.r = static_cast<int>(s.r);
  params.s = static_cast<int>(s.s);
  params.stride_h = static_cast<int>(s.stride_h), params.stride_w = static_cast<int>(s.stride_w);
  params.pad_top = static_cast<int>(s.pad_top), params.pad_left = static_cast<int>(s.pad_left);
  params.dilation_h = static_cast<int>(s.dilation_h), params.dilation_w = static_cast<int>(s.dilation_w);
  params.q_divider = FastDivmod(s.q), params.p_divider = FastDivmod(s.p);
  params.m = static_cast<int>(s.n * s.p * s.q);
  params.channel_tiles = static_cast<int>((s.c + kTileK - 1) / kTileK);
  params.k_tiles = static_cast<int>(s.r * s.s) * params.channel_tiles;
  const int64_t last_channel_tile = (params.channel_tiles - 1) * kChunks, c_vectors = s.c / 8;
  params.x_step_s = static_cast<uint32_t>(s.dilation_w * c_vectors - last_channel_tile);
  params.x_step_r =
      static_cast<uint32_t>((s.dilation_h * s.w - (s.s - 1) * s.dilation_w) * c_vectors - last_channel_tile);
  params.w_step_tap = static_cast<uint32_t>(c_vectors - last_channel_tile);
  params.act = args.act;
  params.slope = args.slope;
  params.clip_low = args.clip_low, params.clip_high = args.clip_high;
  params.vector_store = s.k % 8 == 0 && reinterpret_cast<std::uintptr_t>(args.y) % 16 == 0;
  return params;
}

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// ---------------------------------------------------------------------------------------------------------------
// A 1x1 convolution of at most 64 output pixels (a squeeze-and-excitation's convs on [N, 1, 1, C]: EfficientNet-B0's
// 32 of them took 8-15 us each, ~0.33 of its 1.757 ms, H200 session 33): the tiles above put all M in one 128-row
// tile and walk C serially in one CTA per 64 filters (a 1152 -> 48 conv: one CTA, 18 steps of 64 channels). Here a
// block takes kFilters filters for every pixel and its warps split C between them (warp w takes the channel
// vectors w, w + warps, ...; lane l the pixels l and l + 32), the block's filters staged in shared memory as floats;
// the warps' partial sums meet in shared memory, and one thread per output adds them in a fixed order
// (deterministic) and applies the epilogue, y rounded once.
// Latency, not bandwidth, bounds it (1152 -> 48 moves 74 KB of x): the first version (4 filters and 8 warps a block,
// one x load at a time) took 23.2 us there against cuDNN's 4.2 (session 34 mid call, H200): 12 blocks, each warp
// waiting on 18 loads in turn. Now a block takes 2 filters where K <= 256 (twice the blocks; 4 for wider K, as every
// block reads all of x: ResNet-50 batch 1's 512 -> 2048 on 7 x 7 would read 51 MB of L2 at 2), up to 16 warps (as
// many as put each warp's vectors in one batch of kPointwiseBatch), and each warp issues its batch of loads together;
// the first batch is issued before the filters are staged, so both latencies overlap. 1152 -> 48: 24 blocks of 15
// warps, one batch of 10 loads per lane.
constexpr int kPointwiseFewFilters = 2;   // K <= kPointwiseWideK: twice the blocks of 4
constexpr int kPointwiseManyFilters = 4;  // wider K: each block reads all of x, so fewer blocks read it less often
constexpr int kPointwiseWideK = 256;
constexpr int kPointwiseMaxWarps = 16;
constexpr int kPointwiseBatch = 10;   // x vectors in flight per lane
constexpr int kPointwiseMaxPixels = 64;
constexpr int kPointwiseMaxChannels = 1536;  // the filters as floats: kFilters * C * 4 bytes <= 24 KB
// Every block reads all of x for its few filters: with many weights the tiles do better. Session 35's mid call (H200,
// CUDA-graph replay): ResNet-50 batch 1's 512 -> 2048 on 7 x 7 took 17.6 us here, 10.1 on the tiles (cuDNN 5.1);
// EfficientNet's SE convs (C * K <= 55,296) 2.7-5.8 us here against the tiles' 9-18.
constexpr int64_t kPointwiseMaxWeights = int64_t{1} << 17;

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&out)[8]) {
  const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_float(values[i]);
}

// Warps per block: enough that each holds its share of C's vectors in one batch, at most kPointwiseMaxWarps.
int pointwise_warps(int64_t c) {
  const int64_t vectors = c / 8;
  return static_cast<int>(std::min<int64_t>(kPointwiseMaxWarps, std::max<int64_t>(1, (vectors + kPointwiseBatch - 1) /
                                                                                          kPointwiseBatch)));
}

template <typename T, int kFilters>
__global__ void __launch_bounds__(kPointwiseMaxWarps * 32) pointwise_small_m(Params p) {
  __shared__ __align__(16) float filters[kFilters * kPointwiseMaxChannels];  // [filter][C]
  __shared__ float partial[kPointwiseMaxWarps][kPointwiseMaxPixels][kFilters];
  const int first_filter = blockIdx.x * kFilters, thread = threadIdx.x;
  const int filters_here = min(kFilters, p.k - first_filter);
  const int warps = blockDim.x / 32, warp = thread / 32, lane = thread % 32, vectors = p.c / 8;
  const int per_pass = kPointwiseBatch * warps;  // vectors the block's warps cover in one batch each
  const uint4* x = static_cast<const uint4*>(p.x);  // [M][C], 16-byte aligned, C % 8 == 0
  // Vector u of a batch starting at `first`: first + u * warps (warp-uniform, so the guards below do not diverge);
  // past C, or for a pixel past M, the slot holds zeros and is not read.
  uint4 raw[kPointwiseBatch];
  const auto load_batch = [&](int pixel, int first) {
#pragma unroll
    for (int u = 0; u < kPointwiseBatch; ++u) {
      const int vector = first + u * warps;
      raw[u] = make_uint4(0u, 0u, 0u, 0u);
      if (vector < vectors && pixel < p.m) raw[u] = x[int64_t(pixel) * vectors + vector];
    }
  };
  load_batch(lane, warp);  // pixel `lane`'s first batch, in flight while the filters are staged

  const uint4* w = static_cast<const uint4*>(p.w);  // [K][C], 16-byte aligned, C % 8 == 0
#pragma unroll
  for (int filter = 0; filter < kFilters; ++filter) {
    for (int vector = thread; vector < vectors; vector += blockDim.x) {
      float values[8] = {};
      if (filter < filters_here) {
        const uint4 taps = w[int64_t(first_filter + filter) * vectors + vector];  // one 16-byte load
        unpack8<T>(taps, values);
      }
      float4* staged = reinterpret_cast<float4*>(filters + filter * p.c + vector * 8);
      staged[0] = make_float4(values[0], values[1], values[2], values[3]);
      staged[1] = make_float4(values[4], values[5], values[6], values[7]);
    }
  }
  __syncthreads();

  float acc[2][kFilters] = {};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (32 * half >= p.m) break;  // uniform: no pixel of this half
    const int pixel = lane + 32 * half;
    for (int first = warp; first < vectors; first += per_pass) {
      if (half != 0 || first != warp) load_batch(pixel, first);
#pragma unroll
      for (int u = 0; u < kPointwiseBatch; ++u) {
        const int vector = first + u * warps;
        if (vector >= vectors) break;  // uniform
        float values[8];
        unpack8<T>(raw[u], values);
#pragma unroll
        for (int filter = 0; filter < kFilters; ++filter) {
          const float4* taps = reinterpret_cast<const float4*>(filters + filter * p.c + vector * 8);
          const float4 low = taps[0], high = taps[1];  // one address for the whole warp: a broadcast
          acc[half][filter] += values[0] * low.x + values[1] * low.y + values[2] * low.z + values[3] * low.w +
                               values[4] * high.x + values[5] * high.y + values[6] * high.z + values[7] * high.w;
        }
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int filter = 0; filter < kFilters; ++filter) partial[warp][lane + 32 * half][filter] = acc[half][filter];
  }
  __syncthreads();
  const T* bias = static_cast<const T*>(p.bias);
  const T* residual = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  for (int output = thread; output < p.m * kFilters; output += blockDim.x) {
    const int pixel = output / kFilters, filter = output % kFilters;
    if (filter >= filters_here) continue;
    float sum = 0.0f;
    for (int from = 0; from < warps; ++from) sum += partial[from][pixel][filter];
    const int64_t at = int64_t(pixel) * p.k + first_filter + filter;
    if (bias != nullptr) sum += to_float(bias[first_filter + filter]);
    if (residual != nullptr) sum += to_float(residual[at]);
    y[at] = from_float<T>(clip_value(apply_act(p.act, sum, p.slope), p.clip_low, p.clip_high));
  }
}

bool pointwise_small_m_applies(const Shape& s) {
  return s.r == 1 && s.s == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_top == 0 && s.pad_left == 0 &&
         s.p == s.h && s.q == s.w && s.n * s.p * s.q <= kPointwiseMaxPixels && s.c <= kPointwiseMaxChannels &&
         s.c * s.k <= kPointwiseMaxWeights;
}

}  // namespace

std::string implicit_gemm_configs() {
  std::string text;
  for (int index = 0; index < kConfigCount; ++index) {
    const Config& config = kConfigs[index];
    text += (index ? ", " : "") + std::to_string(index) + " = " + std::to_string(config.bm) + "x" +
            std::to_string(config.bn) + " " + std::to_string(config.warps_m * config.warps_n) + " warps " +
            std::to_string(config.stages) + " stages (warp " + std::to_string(config.bm / config.warps_m) + "x" +
            std::to_string(config.bn / config.warps_n) + ", " + std::to_string(config.min_blocks) + " CTAs/SM" +
            (config.prefetch ? ", prefetch loop" : "") + (config.through_l1 ? ", x via L1" : "") + ")";
  }
  return text;
}

std::string implicit_gemm_unsupported_reason(const Shape& s, bool backward) {
  if (backward) return "forward only (backward runs on cudnn or im2col_gemm)";
  if (s.layout != Layout::NHWC) return "NHWC only (NCHW runs on cudnn or im2col_gemm)";
  if (s.dtype != DType::Float16 && s.dtype != DType::BFloat16) {
    return std::string("float16 and bfloat16 only (float32 runs on cudnn or im2col_gemm), got ") +
           dtype_name(s.dtype);
  }
  if (s.groups != 1) return "groups == 1 only (grouped and depthwise run on cudnn or im2col_gemm), got groups=" +
                            std::to_string(s.groups);
  if (s.c % 8 != 0) {
    return "input channels C must be a multiple of 8 (16-byte cp.async vectors), got C=" + std::to_string(s.c);
  }
  if (s.r > 16 || s.s > 16) {
    return "filter height R and width S at most 16 (a bit per filter row and column), got " + std::to_string(s.r) +
           "x" + std::to_string(s.s);
  }
  const int64_t limit = INT_MAX / 2;
  if (s.n * s.p * s.q > limit || s.h * s.w * s.c > limit || s.k * s.r * s.s * s.c > limit || s.h > limit ||
      s.w > limit || s.n * s.h * s.w * s.c / 8 > limit) {
    return "N*P*Q, H*W*C and K*R*S*C must stay below 2^30 and N*H*W*C below 2^33 (32-bit tile indexing)";
  }
  return "";
}

bool implicit_gemm_aligned(const ForwardArgs& args) { return aligned_16(args.x) && aligned_16(args.w); }

void implicit_gemm_forward(const ForwardArgs& args, cudaStream_t stream) {
  const int forced = forced_config();
  const Params params = make_params(args);
  if (forced < 0 && pointwise_small_m_applies(args.shape)) {  // a forced config (the sweep, its tests) runs as named
    const bool few = params.k <= kPointwiseWideK;
    const int filters = few ? kPointwiseFewFilters : kPointwiseManyFilters;
    const unsigned blocks = static_cast<unsigned>((params.k + filters - 1) / filters);
    const unsigned threads = static_cast<unsigned>(pointwise_warps(args.shape.c) * 32);
    const bool half = args.shape.dtype == DType::Float16;
    const auto kernel = few ? (half ? pointwise_small_m<__half, kPointwiseFewFilters>
                                    : pointwise_small_m<__nv_bfloat16, kPointwiseFewFilters>)
                            : (half ? pointwise_small_m<__half, kPointwiseManyFilters>
                                    : pointwise_small_m<__nv_bfloat16, kPointwiseManyFilters>);
    kernel<<<blocks, threads, 0, stream>>>(params);
    GE2_CHECK_LAUNCH("implicit_gemm pointwise_small_m");
    return;
  }
  const int device = current_device();
  const Config& config = kConfigs[forced >= 0 ? forced : choose_config(params, device)];
  (args.shape.dtype == DType::Float16 ? config.half : config.bfloat16)(params, device, stream);
}

}  // namespace ge2::conv2d
