// implicit_gemm: GE2's own conv2d forward on tensor cores, NHWC, float16/bfloat16 in, float32 accumulation, no
// im2col buffer. GEMM view: M = N*P*Q output pixels, N = K output channels, reduction = R*S*C taken as R*S*ceil(C/32)
// tiles of 32 channels. Each block computes a BM x BN tile of y; the A tile (BM pixels x 32 channels of one filter
// tap) is gathered from x on the fly with 16-byte cp.async (padding, stride and dilation decided per vector; outside
// the input, past C or past M the copy reads 0 bytes and zero-fills), the B tile (BN filters x 32 channels) comes
// from w [K, R, S, C]. Multi-stage cp.async pipeline in XOR-swizzled shared memory, ldmatrix.x4 fragments,
// mma.sync m16n8k16, and an epilogue that adds the bias, applies the activation and writes y in its dtype.
#include <algorithm>
#include <atomic>
#include <climits>
#include <type_traits>

#include "api.hpp"
#include "status.hpp"

namespace ge2::conv2d {
namespace {

constexpr int kTileK = 32;             // channels per reduction tile: 4 vectors of 8 halves, a 64-byte smem row
constexpr int kChunks = kTileK / 8;    // 16-byte vectors per smem row

struct Params {
  const void* x;
  const void* w;
  const void* bias;  // nullptr: none
  void* y;
  int n, h, w_in, c, k, r, s, p, q;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  int m;             // N * P * Q
  int channel_tiles; // ceil(C / 32)
  int k_tiles;       // R * S * channel_tiles
  int n_tiles;       // ceil(K / BN): the fast index of the 1-d grid (neighbouring blocks share their x tile)
  Act act;
  float slope;
  bool pair_store;   // y rows of an even K at a 4-byte aligned address: two outputs per store
};

// Swizzled element offset of 16-byte vector `chunk` in row `row` of a [rows][32] tile: rows are 64 bytes, so rows
// r and r + 2 share banks; XOR-ing the chunk with (row / 2) % 4 makes the 8 rows an ldmatrix reads conflict-free.
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  return row * kTileK + ((chunk ^ ((row >> 1) & 3)) << 3);
}

__device__ __forceinline__ unsigned smem_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared; with `valid` false it reads nothing and writes zeros.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&fragment)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(address));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
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

// BM x BN block tile, WarpsM x WarpsN warps (each a (BM / WarpsM) x (BN / WarpsN) tile of m16n8 MMAs), a
// Stages-deep cp.async pipeline.
template <typename T, int BM, int BN, int WarpsM, int WarpsN, int Stages>
__global__ void __launch_bounds__(WarpsM * WarpsN * 32)
    implicit_gemm_kernel(const Params params) {
  constexpr int kThreads = WarpsM * WarpsN * 32, kStages = Stages;
  constexpr int kWarpM = BM / WarpsM, kWarpN = BN / WarpsN;
  constexpr int kMmaM = kWarpM / 16, kMmaN = kWarpN / 8;
  constexpr int kVectorsA = BM * kChunks / kThreads, kVectorsB = BN * kChunks / kThreads;
  static_assert(kMmaN % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
  static_assert(BM * kChunks % kThreads == 0 && BN * kChunks % kThreads == 0, "whole vectors per thread");
  static_assert(kThreads % kChunks == 0, "a thread keeps its channel chunk for every vector it loads");

  extern __shared__ __align__(128) unsigned char shared_bytes[];
  T* tiles_a = reinterpret_cast<T*>(shared_bytes);  // [kStages][BM][32]
  T* tiles_b = tiles_a + kStages * BM * kTileK;      // [kStages][BN][32]

  const T* __restrict__ x = static_cast<const T*>(params.x);
  const T* __restrict__ w = static_cast<const T*>(params.w);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WarpsN, warp_n = warp % WarpsN;
  const int block_n = (blockIdx.x % params.n_tiles) * BN;
  const int block_m = (blockIdx.x / params.n_tiles) * BM;

  // The rows this thread loads (vector i covers row (tid + i * kThreads) / 4, channel chunk tid % 4): where each
  // output pixel's window starts in x, or -1 rows for pixels past M (never inside the input).
  const int chunk = tid % kChunks;
  int64_t a_image[kVectorsA];
  int a_top[kVectorsA], a_left[kVectorsA];
#pragma unroll
  for (int i = 0; i < kVectorsA; ++i) {
    const int pixel = block_m + (tid + i * kThreads) / kChunks;
    if (pixel < params.m) {
      const int q = pixel % params.q, rest = pixel / params.q;
      const int p = rest % params.p, image = rest / params.p;
      a_image[i] = static_cast<int64_t>(image) * params.h * params.w_in * params.c;
      a_top[i] = p * params.stride_h - params.pad_top;
      a_left[i] = q * params.stride_w - params.pad_left;
    } else {
      a_image[i] = 0;
      a_top[i] = INT_MIN / 2;  // fails the row check for every tap
      a_left[i] = 0;
    }
  }
  int64_t b_filter[kVectorsB];
  bool b_valid[kVectorsB];
#pragma unroll
  for (int i = 0; i < kVectorsB; ++i) {
    const int filter = block_n + (tid + i * kThreads) / kChunks;
    b_valid[i] = filter < params.k;
    b_filter[i] = static_cast<int64_t>(b_valid[i] ? filter : 0) * params.r * params.s * params.c;
  }

  // Reduction tile kt = (tap_r * S + tap_s) * channel_tiles + channel_tile, walked in order by the loads.
  int load_r = 0, load_s = 0, load_channel_tile = 0;
  auto load_tile = [&](int stage) {
    const int channel = load_channel_tile * kTileK + chunk * 8;
    const bool channel_ok = channel < params.c;
    const int dh = load_r * params.dilation_h, dw = load_s * params.dilation_w;
    T* stage_a = tiles_a + stage * BM * kTileK;
    T* stage_b = tiles_b + stage * BN * kTileK;
#pragma unroll
    for (int i = 0; i < kVectorsA; ++i) {
      const int row = (tid + i * kThreads) / kChunks;
      const int hi = a_top[i] + dh, wi = a_left[i] + dw;
      const bool valid = channel_ok && static_cast<unsigned>(hi) < static_cast<unsigned>(params.h) &&
                         static_cast<unsigned>(wi) < static_cast<unsigned>(params.w_in);
      const T* src = valid ? x + a_image[i] + (static_cast<int64_t>(hi) * params.w_in + wi) * params.c + channel : x;
      cp_async_16(smem_address(stage_a + tile_offset(row, chunk)), src, valid);
    }
    const int tap = (load_r * params.s + load_s) * params.c + channel;
#pragma unroll
    for (int i = 0; i < kVectorsB; ++i) {
      const int row = (tid + i * kThreads) / kChunks;
      const bool valid = channel_ok && b_valid[i];
      cp_async_16(smem_address(stage_b + tile_offset(row, chunk)), valid ? w + b_filter[i] + tap : w, valid);
    }
    if (++load_channel_tile == params.channel_tiles) {
      load_channel_tile = 0;
      if (++load_s == params.s) {
        load_s = 0;
        ++load_r;
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

#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < params.k_tiles) load_tile(stage);
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  }

  // ldmatrix lanes: A (x4 = a 16x16 tile): lane -> row lane % 16, chunk lane / 16 of the k16 step. B (x4 = two n8
  // tiles x k16): lane -> row lane % 8 + (lane / 16) * 8, chunk (lane / 8) % 2.
  const int a_row = warp_m * kWarpM + (lane & 15), a_chunk = lane >> 4;
  const int b_row = warp_n * kWarpN + (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;

  for (int kt = 0; kt < params.k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt is visible to all, and every warp is done with the stage refilled below
    const int next = kt + kStages - 1;
    if (next < params.k_tiles) load_tile(next % kStages);
    cp_async_commit();

    const T* stage_a = tiles_a + (kt % kStages) * BM * kTileK;
    const T* stage_b = tiles_b + (kt % kStages) * BN * kTileK;
#pragma unroll
    for (int k16 = 0; k16 < kTileK / 16; ++k16) {
      unsigned a_fragments[kMmaM][4];
      unsigned b_fragments[kMmaN / 2][4];
#pragma unroll
      for (int i = 0; i < kMmaM; ++i) {
        ldmatrix_x4(a_fragments[i], smem_address(stage_a + tile_offset(a_row + i * 16, k16 * 2 + a_chunk)));
      }
#pragma unroll
      for (int j = 0; j < kMmaN / 2; ++j) {
        ldmatrix_x4(b_fragments[j], smem_address(stage_b + tile_offset(b_row + j * 16, k16 * 2 + b_chunk)));
      }
#pragma unroll
      for (int i = 0; i < kMmaM; ++i) {
#pragma unroll
        for (int j = 0; j < kMmaN; ++j) {
          mma_16816<T>(acc[i][j], a_fragments[i], b_fragments[j / 2][(j % 2) * 2],
                       b_fragments[j / 2][(j % 2) * 2 + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulator element e of tile (i, j) is y[row + (e / 2) * 8][col + e % 2], row = lane / 4 within
  // the m16 tile, col = 2 * (lane % 4) within the n8 tile. y is [M][K] (NHWC), so a pixel's outputs are a row.
  const T* bias = static_cast<const T*>(params.bias);
  T* y = static_cast<T*>(params.y);
#pragma unroll
  for (int j = 0; j < kMmaN; ++j) {
    const int col = block_n + warp_n * kWarpN + j * 8 + (lane & 3) * 2;
    if (col >= params.k) continue;
    const bool second = col + 1 < params.k;
    const float bias0 = bias != nullptr ? to_float(bias[col]) : 0.0f;
    const float bias1 = bias != nullptr && second ? to_float(bias[col + 1]) : 0.0f;
#pragma unroll
    for (int i = 0; i < kMmaM; ++i) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = block_m + warp_m * kWarpM + i * 16 + (lane >> 2) + half * 8;
        if (row >= params.m) continue;
        const float v0 = apply_act(params.act, acc[i][j][half * 2] + bias0, params.slope);
        const float v1 = apply_act(params.act, acc[i][j][half * 2 + 1] + bias1, params.slope);
        T* out = y + static_cast<int64_t>(row) * params.k + col;
        if (params.pair_store) {
          *reinterpret_cast<typename Pair<T>::type*>(out) = Pair<T>::make(v0, v1);
        } else {
          out[0] = from_float<T>(v0);
          if (second) out[1] = from_float<T>(v1);
        }
      }
    }
  }
}

template <typename T, int BM, int BN, int WarpsM, int WarpsN, int Stages>
void launch_tile(const Params& params, cudaStream_t stream) {
  constexpr int kThreads = WarpsM * WarpsN * 32;
  constexpr std::size_t kSharedBytes = std::size_t(Stages) * (BM + BN) * kTileK * sizeof(T);
  auto kernel = implicit_gemm_kernel<T, BM, BN, WarpsM, WarpsN, Stages>;
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once per device.
  static std::atomic<uint64_t> opted_in{0};
  int device = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
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

// One tile shape: 128 x 64 with 4 warps of 64 x 32 and 4 stages. Measured on an H100 over the ResNet-50 layers
// (N=32) it was within 20% of the best of ten shapes everywhere, while 64 x 64 warp tiles (128 x 128, 128 x 256,
// 256 x 128 blocks) ran 1.5-3x slower.
template <typename T>
void launch_typed(const Params& params, cudaStream_t stream) {
  launch_tile<T, 128, 64, 2, 2, 4>(params, stream);
}

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

Params make_params(const ForwardArgs& args) {
  const Shape& s = args.shape;
  Params params{};
  params.x = args.x, params.w = args.w, params.bias = args.bias, params.y = args.y;
  params.n = static_cast<int>(s.n), params.h = static_cast<int>(s.h), params.w_in = static_cast<int>(s.w);
  params.c = static_cast<int>(s.c), params.k = static_cast<int>(s.k), params.r = static_cast<int>(s.r);
  params.s = static_cast<int>(s.s), params.p = static_cast<int>(s.p), params.q = static_cast<int>(s.q);
  params.stride_h = static_cast<int>(s.stride_h), params.stride_w = static_cast<int>(s.stride_w);
  params.pad_top = static_cast<int>(s.pad_top), params.pad_left = static_cast<int>(s.pad_left);
  params.dilation_h = static_cast<int>(s.dilation_h), params.dilation_w = static_cast<int>(s.dilation_w);
  params.m = static_cast<int>(s.n * s.p * s.q);
  params.channel_tiles = static_cast<int>((s.c + kTileK - 1) / kTileK);
  params.k_tiles = static_cast<int>(s.r * s.s) * params.channel_tiles;
  params.act = args.act;
  params.slope = args.slope;
  params.pair_store = s.k % 2 == 0 && reinterpret_cast<std::uintptr_t>(args.y) % 4 == 0;
  return params;
}

}  // namespace

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
  const int64_t limit = INT_MAX / 2;
  if (s.n * s.p * s.q > limit || s.h * s.w * s.c > limit || s.k * s.r * s.s * s.c > limit || s.h > limit ||
      s.w > limit) {
    return "N*P*Q, H*W*C and K*R*S*C must stay below 2^30 (32-bit tile indexing)";
  }
  return "";
}

bool implicit_gemm_aligned(const ForwardArgs& args) { return aligned_16(args.x) && aligned_16(args.w); }

void implicit_gemm_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Params params = make_params(args);
  if (args.shape.dtype == DType::Float16) {
    launch_typed<__half>(params, stream);
  } else {
    launch_typed<__nv_bfloat16>(params, stream);
  }
}

}  // namespace ge2::conv2d
