// flash_sm90 forward (compiled for sm_90a only, on CuTe): a CTA owns kBlockM = 128 query rows of one (batch, head)
// at a time (a work item) and is three warpgroups. Warpgroup 0 is the producer: one thread loads each item's Q tile
// and its K and V tiles of kBlockN rows (128; 80 at head_dim 256) with TMA, K and V into a kStages-deep shared-memory
// ring, each buffer guarded by a "full" mbarrier (TMA's transaction count) and an "empty" one (the consumers'
// release). Warpgroups 1 and 2 are the consumers, 64 query rows each: S = Q K^T on wgmma from shared memory (SS), the
// online softmax in float32 registers (log2 domain), then O += P V on wgmma with P from registers (RS), float32
// accumulators throughout, lse and O written once an item (O by stmatrix into shared memory, then TMA stores). As in
// FlashAttention-3, tile j's S is issued with tile j-1's P V, so tile j's softmax overlaps that product, and the two
// consumers issue their gemms in turns (ping-pong), so one's softmax overlaps the other's gemms.
// setmaxnreg moves registers from the producer (40) to the consumers (232), which hold S, O and P (CUTLASS's split for
// two consumer warpgroups: 40 * 128 + 232 * 256 <= 64K).
//
// Persistent CTAs (up to head_dim 128; non-causal problems, and causal ones up to 1024 rows): a CTA per SM walks
// work items in the L2-sectioned order. Q is double-buffered and O has a tile of its own, so the producer loads the
// next item's Q and K/V tiles while the consumers work on the current one, and each consumer stores its own 64 rows
// of O, so neither waits for the other at an item's end and their ping-pong runs on into the next item.
//
// TMA reads rows past seq_q or seq_k as zeros, so any length runs: scores of keys >= seq_k (and, causal, keys past
// the row) are masked to -inf in the tiles that reach them, and rows >= seq_q are computed and not written (TMA clips
// them from the store).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "../api.hpp"
#include "../kernels/flash_common.cuh"
#include "status.hpp"

namespace ge2::attention::flash_sm90 {

using namespace cute;

constexpr int kSharedMemoryBytes = 227 * 1024;  // an sm_90 CTA's dynamic shared memory at most

template <int kHeadDim_, typename Element_>
struct Traits {
  using Element = Element_;  // cutlass::half_t or cutlass::bfloat16_t
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  // head_dim 256: Q (64 KB) and a 2-stage K/V ring of 80-row tiles (160 KB) fill 224 of the 227 KB of shared memory,
  // and a consumer thread holds O (128 floats) and S (40).
  static constexpr int kBlockN = kHeadDim == 256 ? 80 : 128;
  static constexpr int kStages = 2;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;

  using TileQK = cute::Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using TilePV = cute::Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;
  using Warpgroups = Layout<cute::Shape<Int<kConsumerWarpgroups>, _1, _1>>;  // each warpgroup: 64 rows of the tile
  using MmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, TileQK>(), Warpgroups{}));
  // One wgmma spans the key tile (80 is one of CuTe's extended shapes, which CMake enables for these sources).
  static_assert(size<1>(typename MmaQK::AtomShape_MNK{}) == kBlockN, "S = Q K^T would run in narrower wgmma tiles");
  // P V: P (rows x keys) from registers, K-major; V stored [key][dim] is the B operand (dim x key) in MN-major.
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, TilePV, GMMA::Major::K, GMMA::Major::MN>(), Warpgroups{}));

  // Rows of kHeadDim 16-bit values (128, 256 or 512 bytes) in the 128-byte swizzle that wgmma and TMA share.
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                              cute::Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V's stages seen as (dim, key, stage): the same bytes, the transposed view the P V product reads.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_ordered_layout(cute::Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // Global tensors as (seq, dim, head, batch) with element strides: both layouts (bhsd, bshd) are strides.
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemShape{},
                                          GmemStride{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKV{}),
                                       cute::Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // Persistent CTAs (several work items a CTA) up to head_dim 128, where shared memory has room for O's own tile, so
  // that the producer loads the next item's Q while the consumers finish the current one. At head_dim 256 (Q and the
  // ring fill 224 of the 227 KB) a CTA runs one item and O goes out through Q's tile.
  static constexpr bool kPersistent = kHeadDim <= 128;
  // Persistent, Q is double-buffered (shared memory: 2 Q tiles, the K/V ring and O's tile, 224 KB at head_dim 128), so
  // the producer loads the next item's Q while the consumers still read the current one.
  static constexpr int kQBuffers = kPersistent ? 2 : 1;

  // O leaves by stmatrix from the accumulators (16 bytes a thread per instruction) into shared memory, then TMA
  // stores. Persistent, each consumer stores its own 64 rows (its half of O's tile, laid out one after the other), so
  // neither waits for the other at an item's end and their ping-pong runs on into the next item; at head_dim 256 the
  // tile (Q's) goes out in one store.
  static constexpr int kStoreRows = kPersistent ? 64 : kBlockM;
  static constexpr int kStoreUnits = kBlockM / kStoreRows;
  static constexpr int kStoreThreads = 2 * kStoreRows;  // a warpgroup's 64 rows, or both
  using SmemLayoutOStore = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                                  cute::Shape<Int<kStoreRows>, Int<kHeadDim>>{}));
  using SmemLayoutOUnits = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                                  cute::Shape<Int<kStoreRows>, Int<kHeadDim>, Int<kStoreUnits>>{}));
  // (row, dim) of the 128-row tile over the units: row = r + kStoreRows * unit.
  using SmemLayoutO = std::conditional_t<
      kPersistent,
      decltype(composition(SmemLayoutOUnits{},
                           make_layout(cute::Shape<cute::Shape<Int<kStoreRows>, Int<kStoreUnits>>, Int<kHeadDim>>{},
                                       Stride<Stride<_1, Int<kStoreRows * kHeadDim>>, Int<kStoreRows>>{}))),
      SmemLayoutQ>;
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutOStore{},
                                      cute::Shape<Int<kStoreRows>, Int<kHeadDim>>{}, _1{}));
  using SmemCopyO = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  using SmemLayoutQBuffers = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                                    cute::Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQBuffers>>{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQBuffers{}),
                                      cute::Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);  // one K or V tile
  // Named barriers of the consumers (0 and 1: their turns), per store unit (+ its index).
  static constexpr uint32_t kOutputWrittenBarrier = 2;  // O's rows written to shared memory
  static constexpr uint32_t kOutputFreeBarrier = 4;     // the previous work item's O store has read them

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQBuffers>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, kPersistent ? cosize_v<SmemLayoutO> : 1, 1024> o;
    alignas(8) uint64_t q_full[kQBuffers], q_empty[kQBuffers];
    uint64_t k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];
  };
};

template <class T>
struct Params {
  typename T::TmaQ tma_q;
  typename T::TmaKV tma_k, tma_v;
  typename T::TmaO tma_o;  // Q's strides
  float* lse;              // [batch, heads_q, seq_q]
  int32_t batch, heads_q, heads_kv, seq_q, seq_k;
  float scale_log2;  // scale * log2(e): the softmax runs on exp2
  int32_t heads_per_section;  // of batch x heads_q, for l2_sectioned_head_block
  int32_t m_blocks;           // query blocks of a head
  int32_t work_items;         // batch x heads_q x m_blocks; a CTA runs items blockIdx.x, + gridDim.x, ...
  bool causal;
};

// 2^x on the SFU with denormals flushed: one MUFU.EX2, where exp2f adds a range test and two scalings for denormal
// results, which the softmax does not need (a weight under 2^-126 of its row's largest changes no rounded output).
__device__ __forceinline__ float exp2_flushed(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ((2, 2, N/8), MMA_M, MMA_N), a wgmma accumulator's per-thread layout, as (rows, columns): ((2, MMA_M), (2, N/8,
// MMA_N)). A thread holds 2 rows (r and r + 8) of its warp's 16, in column pairs spread over the 4 threads of a quad.
template <class Layout>
__device__ constexpr auto rows_by_columns(Layout accumulator) {
  return make_layout(make_layout(get<0, 1>(accumulator), get<1>(accumulator)),
                     make_layout(get<0, 0>(accumulator), get<0, 2>(accumulator), get<2>(accumulator)));
}

// The S accumulator's layout read as the A operand of the P V wgmma (16-bit A: k-blocks of 16 columns are pairs of
// 8-column accumulator blocks): ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, (N/16, MMA_N)).
template <class Layout>
__device__ constexpr auto accumulator_as_a_operand(Layout accumulator) {
  auto blocks = logical_divide(get<0, 2>(accumulator), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(accumulator), get<0, 1>(accumulator), get<0, 0>(blocks)),
                     get<1>(accumulator), coalesce(make_layout(get<0, 1>(blocks), get<2>(accumulator))));
}

// Which (head, block) work item `cta` (a CTA's linear index, or a persistent CTA's item) runs: heads (batch x heads)
// in sections whose shared tiles (K and V of the forward's query blocks; Q, dO and the dQ accumulator of the
// backward's key blocks) fit in L2 together, a section's items block by block (the caller's block 0 first), all its
// heads at each. The hardware starts CTAs in the order of their linear index (and persistent CTAs take items in
// waves of that order), so the blocks of one head run close together and read those tiles from L2, where
// head-major order (one block of every head, then the next) had more heads in flight than L2 holds once the grid
// exceeds a wave.
struct HeadBlock {
  int head, block;
};

__device__ __forceinline__ HeadBlock l2_sectioned_head_block(int cta, int heads, int blocks, int heads_per_section) {
  const int section_ctas = heads_per_section * blocks;
  const int first_head = cta / section_ctas * heads_per_section;
  const int section_heads = min(heads_per_section, heads - first_head);  // the last section may be narrower
  const int within = cta % section_ctas;
  return {first_head + within % section_heads, within / section_heads};
}

// Heads per section, from the bytes the blocks of one head share: about half of the H100's and H200's 50 MB of L2,
// the rest left to the tiles that stream through.
inline int heads_per_l2_section(int64_t shared_bytes_per_head, int64_t heads) {
  constexpr int64_t kSectionBytes = int64_t(24) << 20;
  const int64_t fit = kSectionBytes / (shared_bytes_per_head > 0 ? shared_bytes_per_head : 1);
  return static_cast<int>(fit < 1 ? 1 : fit > heads ? heads : fit);
}

// c (+)= a b over the k-blocks, issued as one wgmma batch by the calling warpgroup, not waited for (warpgroup_wait
// retires batches in order; then fence c, and a from registers, before touching them).
template <bool kZeroInit, bool kRegistersA, class Mma, class A, class B, class C>
__device__ __forceinline__ void issue_warpgroup_gemm(Mma& mma, A&& a, B const& b, C& c) {  // a: a view, or registers
  if constexpr (kRegistersA) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// The same, waited for.
template <bool kZeroInit, bool kRegistersA, class Mma, class A, class B, class C>
__device__ __forceinline__ void warpgroup_gemm(Mma& mma, A& a, B const& b, C& c) {
  issue_warpgroup_gemm<kZeroInit, kRegistersA>(mma, a, b, c);
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
  if constexpr (kRegistersA) warpgroup_fence_operand(a);
}

// A work item: 128 query rows of one (batch, head), and the key tiles they see.
struct WorkItem {
  int bh, b, h, hk, m_block, m0, tiles;
};

template <class T>
__device__ __forceinline__ WorkItem work_item(Params<T> const& p, int index) {
  const HeadBlock work = l2_sectioned_head_block(index, p.batch * p.heads_q, p.m_blocks, p.heads_per_section);
  WorkItem item;
  item.m_block = p.m_blocks - 1 - work.block;  // the longest causal rows start first
  item.bh = work.head;
  item.b = work.head / p.heads_q;
  item.h = work.head % p.heads_q;
  item.hk = item.h / (p.heads_q / p.heads_kv);
  item.m0 = item.m_block * T::kBlockM;
  // The key tiles the rows see: causal (top-left) row i sees keys j <= i, so the last row bounds them.
  const int row_stop = min(p.seq_q, item.m0 + T::kBlockM);
  const int key_stop = p.causal ? min(p.seq_k, row_stop) : p.seq_k;
  item.tiles = (key_stop + T::kBlockN - 1) / T::kBlockN;  // >= 1: seq_k >= 1 and row m0 sees key 0
  return item;
}

// A CTA runs work items blockIdx.x, blockIdx.x + gridDim.x, ...: one where the grid has an item per CTA (always at
// head_dim 256, T::kPersistent false), several where it is persistent (a CTA per SM). Across a CTA's items the K/V
// ring keeps turning (its stage and phase count the CTA's tiles) and Q's buffers alternate, so the producer loads the
// next item's Q and K/V tiles while the consumers still work on the current one.
// The softmax folds the scaling into each score's exp2 (FlashAttention-3's way): it takes the row max of the raw
// scores and scales that once a row, and each exponent is one FFMA, s * scale_log2 - max (scaling every score first
// costs an FMUL before the max and an FADD after it: session 38's H200 bench, (8,12,1024,64) causal 1.038x torch
// against 0.839x). Rounding is monotonic, so for scale > 0 fl(scale_log2 * max s) is the max of the scaled scores,
// and each exponent is rounded once. For scale < 0 (kNegativeScale) the order turns over: the row min of the raw
// scores, scaled, is the max of the scaled ones, and masked scores are +inf (+inf * scale_log2 = -inf). The masked
// tiles compare each score's column offset with one limit a row (FlashAttention-3's col_limit): per-score tests of
// seq_k and the causal bound spilled with the fold (ptxas kept the masks in registers).
template <class T, bool kNegativeScale>
__global__ void __launch_bounds__(T::kThreads, 1) forward_kernel(CUTE_GRID_CONSTANT Params<T> const p) {
  using Element = typename T::Element;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TransactionBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  constexpr int kQBuffers = T::kQBuffers;

  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(shared_bytes);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename T::SmemLayoutQBuffers{});  // (row, dim, buffer)
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename T::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename T::SmemLayoutVt{});
  Element* o_tile = T::kPersistent ? smem.o.data() : smem.q.data();
  Tensor sO = make_tensor(make_smem_ptr(o_tile), typename T::SmemLayoutO{});

  const int warpgroup = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    // The TMA descriptors into the cache now, not at each one's first copy (as CUTLASS's kernels do).
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_o.get_tma_descriptor());
    CUTE_UNROLL
    for (int b = 0; b < kQBuffers; ++b) {
      Barrier::init(&smem.q_full[b], 1);
      // A Q buffer is free again once both consumers' last S = Q K^T of its item is done.
      Barrier::init(&smem.q_empty[b], T::kConsumerThreads);
    }
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&smem.k_full[s], 1);
      Barrier::init(&smem.v_full[s], 1);
      Barrier::init(&smem.k_empty[s], T::kConsumerThreads);
      Barrier::init(&smem.v_empty[s], T::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x != 0) return;
    Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.seq_q, kHeadDim, p.heads_q, p.batch));
    Tensor mK = p.tma_k.get_tma_tensor(make_shape(p.seq_k, kHeadDim, p.heads_kv, p.batch));
    Tensor mV = p.tma_v.get_tma_tensor(make_shape(p.seq_k, kHeadDim, p.heads_kv, p.batch));
    auto cta_q = p.tma_q.get_slice(_0{});
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    Tensor tQsQ = cta_q.partition_D(sQ);  // (TMA, TMA_M, TMA_D, buffer)
    Tensor tKsK = cta_k.partition_D(sK);  // (TMA, TMA_N, TMA_D, stage)
    Tensor tVsV = cta_v.partition_D(sV);
    int ring = 0;  // K/V tiles loaded so far, over the CTA's items
    int items = 0;
    for (int index = int(blockIdx.x); index < p.work_items; index += int(gridDim.x), ++items) {
      const WorkItem item = work_item(p, index);
      Tensor gQ = local_tile(mQ(_, _, item.h, item.b), cute::Shape<Int<kBlockM>, Int<kHeadDim>>{},
                             make_coord(item.m_block, _0{}));
      Tensor gK = local_tile(mK(_, _, item.hk, item.b), cute::Shape<Int<kBlockN>, Int<kHeadDim>>{},
                             make_coord(_, _0{}));
      Tensor gV = local_tile(mV(_, _, item.hk, item.b), cute::Shape<Int<kBlockN>, Int<kHeadDim>>{},
                             make_coord(_, _0{}));
      Tensor tQgQ = cta_q.partition_S(gQ);
      Tensor tKgK = cta_k.partition_S(gK);  // (TMA, TMA_N, TMA_D, tile)
      Tensor tVgV = cta_v.partition_S(gV);

      const int buffer = items % kQBuffers;
      Barrier::wait(&smem.q_empty[buffer], ((items / kQBuffers) & 1) ^ 1);  // the first pass finds it free
      TransactionBarrier::arrive_and_expect_tx(&smem.q_full[buffer], T::kQBytes);
      copy(p.tma_q.with(smem.q_full[buffer]), tQgQ, tQsQ(_, _, _, buffer));
      for (int j = 0; j < item.tiles; ++j, ++ring) {
        const int stage = ring % kStages;
        const uint32_t phase = (ring / kStages) & 1;
        Barrier::wait(&smem.k_empty[stage], phase ^ 1);  // the first pass finds every stage free
        TransactionBarrier::arrive_and_expect_tx(&smem.k_full[stage], T::kKVBytes);
        copy(p.tma_k.with(smem.k_full[stage]), tKgK(_, _, _, j), tKsK(_, _, _, stage));
        Barrier::wait(&smem.v_empty[stage], phase ^ 1);
        TransactionBarrier::arrive_and_expect_tx(&smem.v_full[stage], T::kKVBytes);
        copy(p.tma_v.with(smem.v_full[stage]), tVgV(_, _, _, j), tVsV(_, _, _, stage));
      }
      if constexpr (!T::kPersistent) break;  // one item: the compiler sees a single pass
    }
    return;
  }

  // consumers
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int thread = static_cast<int>(threadIdx.x) - 128;
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  auto thread_qk = mma_qk.get_thread_slice(thread);
  auto thread_pv = mma_pv.get_thread_slice(thread);
  Tensor tSrQ = thread_qk.partition_fragment_A(sQ);   // descriptors (MMA, MMA_M, MMA_K, buffer)
  Tensor tSrK = thread_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrV = thread_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename T::TilePV{}));
  Tensor o = make_tensor(tOrO.data(), rows_by_columns(tOrO.layout()));
  // (row, column) in the tile of every accumulator element of this thread
  Tensor tScS = thread_qk.partition_C(make_identity_tensor(select<0, 1>(typename T::TileQK{})));
  Tensor score_coordinates = make_tensor(tScS.data(), rows_by_columns(tScS.layout()));
  Tensor tOcO = thread_pv.partition_C(make_identity_tensor(select<0, 1>(typename T::TilePV{})));
  Tensor out_coordinates = make_tensor(tOcO.data(), rows_by_columns(tOcO.layout()));
  constexpr int kRows = size<0>(decltype(o.layout()){});  // 2
  auto o_store = make_tiled_copy_C(typename T::SmemCopyO{}, mma_pv);
  auto thread_o_store = o_store.get_thread_slice(thread);

  // Ping-pong: the two consumers take turns to issue their gemms (named barrier i is consumer i's turn), so one's
  // softmax runs while the other's gemms hold the tensor cores. Consumer 0 goes first: consumer 1 gives it the first
  // turn and skips the pass after its own last issue (of the CTA's last item), so both barriers see as many passes
  // as waits. The turns run on across items.
  const int consumer = warpgroup - 1;
  auto wait_turn = [&]() { cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, consumer); };
  auto pass_turn = [&](bool last_issue) {
    if (consumer == 0 || !last_issue) cutlass::arch::NamedBarrier::arrive(T::kConsumerThreads, 1 - consumer);
  };
  if (consumer == 1) pass_turn(false);

  // P in the input dtype, as the A operand (registers) of O += P V.
  constexpr int kScores = decltype(size(partition_fragment_C(mma_qk, select<0, 1>(typename T::TileQK{}))))::value;
  cutlass::NumericArrayConverter<Element, float, kScores> to_element;
  using ScoreArray = cutlass::Array<float, kScores>;
  Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename T::TileQK{}));

  float row_max[kRows], row_sum[kRows], correction[kRows];
  auto reset_rows = [&]() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  };
  // Tile j's scores (of the item whose first row is m0) in place: exp2 of the scaled (masked) scores less the running
  // row max; `correction` is the factor O takes before tile j's P V is added. The masking is compiled in only for the
  // tiles that need it. A masked score (-inf, +inf for scale < 0) scales to -inf, and a row with none visible yet has
  // base 0, so fma(masked, scale_log2, -0) = -inf and its weights are 0.
  auto softmax_tile = [&](auto& scores, int m0, int j, auto masked_tile) {
    constexpr bool masked = decltype(masked_tile)::value;
    Tensor s = make_tensor(scores.data(), rows_by_columns(scores.layout()));
    const int n0 = j * kBlockN;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = m0 + get<0>(score_coordinates(r, 0));
      // The row sees keys below min(seq_k, row + 1 if causal), and a column's offset from the thread's first column
      // is a constant, so each score's mask is one compare with an immediate.
      const int column_limit = (p.causal ? min(p.seq_k, row + 1) : p.seq_k) - (n0 + get<1>(score_coordinates(r, 0)));
      constexpr float kMasked = kNegativeScale ? INFINITY : -INFINITY;
      float tile_max = kMasked;  // of the raw scores; their min for scale < 0
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        if constexpr (masked) {
          if (get<1>(score_coordinates(r, c)) - get<1>(score_coordinates(r, 0)) >= column_limit) s(r, c) = kMasked;
        }
        tile_max = kNegativeScale ? fminf(tile_max, s(r, c)) : fmaxf(tile_max, s(r, c));
      }
      tile_max *= p.scale_log2;  // the scaled scores' max (-inf where all are masked)
      const flash::RowRescale step = flash::rescale_row(row_max[r], tile_max);  // quads hold rows, as in mma.sync
      float sum = 0.0f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2_flushed(fmaf(s(r, c), p.scale_log2, -step.base));
        sum += s(r, c);
      }
      row_sum[r] = row_sum[r] * step.correction + sum;
      correction[r] = step.correction;
    }
  };
  auto softmax = [&](auto& scores, int m0, int j) {
    // Only the tiles that reach past seq_k or, causal, past the item's first row mask elements.
    const int n0 = j * kBlockN;
    if (n0 + kBlockN > p.seq_k || (p.causal && n0 + kBlockN - 1 > m0)) {
      softmax_tile(scores, m0, j, std::true_type{});
    } else {
      softmax_tile(scores, m0, j, std::false_type{});
    }
  };
  auto rescale_o = [&]() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= correction[r];
    }
  };
  // After an item's last S = Q K^T: the producer may load a later item's Q into its buffer.
  auto release_q = [&](int buffer) {
    if constexpr (T::kPersistent) Barrier::arrive(&smem.q_empty[buffer]);
  };

  // An item's O (its last P V done) / row sum, rounded once, and lse = ln(sum exp(scale s)) (+inf for a row with no
  // visible key, whose O is 0); `stored` items went out before it. Persistent, each consumer stores its own 64 rows
  // (a unit); at head_dim 256 both join for one store of the tile.
  auto store_output = [&](const WorkItem& item, int stored, const float (&maxima)[kRows], const float (&sums)[kRows]) {
    float lse[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = sums[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= inverse;
      lse[r] = sum > 0.0f ? maxima[r] * flash::kLn2 + logf(sum) : INFINITY;
    }
    constexpr int kOutputs = decltype(size(tOrO))::value;
    auto o_values = cutlass::NumericArrayConverter<Element, float, kOutputs>{}(
        *reinterpret_cast<cutlass::Array<float, kOutputs> const*>(tOrO.data()));
    Tensor o_register = make_tensor(make_rmem_ptr<Element>(o_values.data()), tOrO.layout());
    const int unit = T::kPersistent ? consumer : 0;
    const bool store_thread = thread % T::kStoreThreads == 0;  // issues (and waits for) the unit's stores
    // O's tile: its own, each unit's rows once the previous item's store of them has read them; or Q's (a
    // warpgroup's QK^T gemms, done, were the only readers of its 64 rows there).
    if constexpr (T::kPersistent) {
      if (stored > 0) {
        if (store_thread) tma_store_wait<0>();
        cutlass::arch::NamedBarrier::sync(T::kStoreThreads, T::kOutputFreeBarrier + unit);
      }
    }
    copy(o_store, thread_o_store.retile_S(o_register), thread_o_store.partition_D(sO));
    // The unit's rows, seen by the async proxy, then one TMA store of them (rows past seq_q are clipped).
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(T::kStoreThreads, T::kOutputWrittenBarrier + unit);
    // lse after the fence, which would otherwise wait for these global stores too (ptxas puts a MEMBAR before it).
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = item.m0 + get<0>(out_coordinates(r, 0));
      if ((threadIdx.x & 3) == 0 && row < p.seq_q) p.lse[int64_t(item.bh) * p.seq_q + row] = lse[r];
    }
    if (store_thread) {
      Tensor mO = p.tma_o.get_tma_tensor(make_shape(p.seq_q, kHeadDim, p.heads_q, p.batch));
      Tensor gO = local_tile(mO(_, _, item.h, item.b), cute::Shape<Int<T::kStoreRows>, Int<kHeadDim>>{},
                             make_coord(item.m_block * T::kStoreUnits + unit, _0{}));
      Tensor sOUnit = make_tensor(make_smem_ptr(o_tile + unit * T::kStoreRows * kHeadDim),
                                  typename T::SmemLayoutOStore{});
      auto cta_o = p.tma_o.get_slice(_0{});
      copy(p.tma_o, cta_o.partition_S(sOUnit), cta_o.partition_D(gO));
      tma_store_arrive();
    }
  };

  int ring = 0;  // K/V tiles consumed so far, over the CTA's items
  int items = 0;
  for (int index = int(blockIdx.x); index < p.work_items; index += int(gridDim.x), ++items) {
    const WorkItem item = work_item(p, index);
    const int m0 = item.m0, tiles = item.tiles;
    const bool last_item = !T::kPersistent || index + int(gridDim.x) >= p.work_items;
    const int buffer = items % kQBuffers;
    reset_rows();

    Barrier::wait(&smem.q_full[buffer], (items / kQBuffers) & 1);
    Barrier::wait(&smem.k_full[ring % kStages], (ring / kStages) & 1);
    wait_turn();
    issue_warpgroup_gemm<true, false>(mma_qk, tSrQ(_, _, _, buffer), tSrK(_, _, _, ring % kStages), tSrS);
    pass_turn(last_item && tiles == 1);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    Barrier::arrive(&smem.k_empty[ring % kStages]);
    if (tiles == 1) release_q(buffer);
    softmax(tSrS, m0, 0);
    auto p_values = to_element(*reinterpret_cast<ScoreArray const*>(tSrS.data()));
    Tensor tOrP = make_tensor(make_rmem_ptr<Element>(p_values.data()), accumulator_as_a_operand(tSrS.layout()));
    clear(tOrO);

    // Tile j's S = Q K_j^T is issued with O += P_{j-1} V_{j-1}; tile j's softmax runs while the tensor cores finish
    // the latter (the intra-warpgroup overlap). The ring's K and V stages are released separately.
    for (int j = 1; j < tiles; ++j) {
      const int stage = (ring + j) % kStages, previous = (ring + j - 1) % kStages;
      Barrier::wait(&smem.k_full[stage], ((ring + j) / kStages) & 1);
      wait_turn();
      issue_warpgroup_gemm<true, false>(mma_qk, tSrQ(_, _, _, buffer), tSrK(_, _, _, stage), tSrS);
      rescale_o();  // by tile j-1's correction: O's last product is done
      Barrier::wait(&smem.v_full[previous], ((ring + j - 1) / kStages) & 1);
      issue_warpgroup_gemm<false, true>(mma_pv, tOrP, tOrV(_, _, _, previous), tOrO);
      pass_turn(last_item && j + 1 == tiles);
      warpgroup_wait<1>();
      warpgroup_fence_operand(tSrS);
      Barrier::arrive(&smem.k_empty[stage]);
      if (j + 1 == tiles) release_q(buffer);
      softmax(tSrS, m0, j);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      Barrier::arrive(&smem.v_empty[previous]);
      p_values = to_element(*reinterpret_cast<ScoreArray const*>(tSrS.data()));
    }
    const int last = (ring + tiles - 1) % kStages;
    rescale_o();
    Barrier::wait(&smem.v_full[last], ((ring + tiles - 1) / kStages) & 1);
    warpgroup_gemm<false, true>(mma_pv, tOrP, tOrV(_, _, _, last), tOrO);
    Barrier::arrive(&smem.v_empty[last]);
    ring += tiles;
    store_output(item, items, row_max, row_sum);
    if constexpr (!T::kPersistent) break;
  }
  // The last stores read shared memory before the CTA exits.
  if (thread % T::kStoreThreads == 0) tma_store_wait<0>();
}

// The (seq, dim, head, batch) view of Q, K or V, whose rows are `pitch` elements apart.
template <class T>
typename T::GmemTensor gmem_view(const void* data, const attention::Shape& s, int64_t heads, int64_t seq) {
  const int64_t pitch = s.seq_major ? heads * s.head_dim : s.head_dim;
  const int64_t head_stride = s.seq_major ? s.head_dim : seq * s.head_dim;
  return make_tensor(make_gmem_ptr(static_cast<typename T::Element const*>(data)),
                     make_shape(int32_t(seq), int32_t(s.head_dim), int32_t(heads), int32_t(s.batch)),
                     make_stride(pitch, _1{}, head_stride, seq * heads * s.head_dim));
}

inline int multiprocessors() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), "attention", "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "attention",
             "cudaDeviceGetAttribute(multiprocessor count)");  // cheap: no cache needed
  return count;
}

// Persistent CTAs (one per SM, each walking its share of the work items) hide each item's Q load and O store behind
// the neighbouring items' work, which pays where an item has few key tiles. Causal items differ in length, and with
// many tiles the hardware's own CTA scheduling balances them better than a fixed share per CTA. On the H200
// (float16, session 35): (16,16,512,128) non-causal forward 0.080 ms against 0.093, (8,12,1024,64) non-causal 0.075
// against 0.083, causal 0.058 against 0.062 (items of at most 8 key tiles), but (4,16,4096,128) causal 0.620 against
// 0.582 (up to 32 tiles). GE2_FLASH_SM90_PERSISTENT=0 or 1 overrides the choice (for measurements).
inline bool persistent_forward(const attention::Shape& s) {
  const char* value = std::getenv("GE2_FLASH_SM90_PERSISTENT");
  if (value != nullptr && (value[0] == '0' || value[0] == '1') && value[1] == '\0') return value[0] == '1';
  return !s.causal || std::min(s.seq_q, s.seq_k) <= 8 * 128;  // causal: the longest item has at most 8 key tiles
}

// The forward's heads per L2 section: as many as keep their K and V within about 24 MB (heads_per_l2_section), but
// for persistent non-causal rows of at most 8 query blocks only as many as one wave of CTAs runs whole
// (ceil(ctas / blocks)): each head's K and V then come from DRAM once for all its CTAs at the same time and every wave
// reads as many new heads, where a 24 MB section (96 heads of (16,16,512,128)) read all its K and V in its first wave
// and little in the next two. Session 38's mid call (H200, graph replay against torch SDPA, best of 5):
// (16,16,512,128) 0.916 -> 0.955 (float16), 0.917 -> 0.963 (bfloat16), 33 heads a section; (8,12,1024,64) 0.981 /
// 0.978 (17), unchanged. Causal rows keep the 24 MB sections: (8,12,1024,64) causal fell from 1.040 to 0.747 with 17.
// GE2_FLASH_SM90_SECTION_HEADS=n (n >= 1) overrides it, for measurements.
inline int forward_heads_per_section(int fit, const attention::Shape& s, int64_t blocks, int64_t ctas,
                                     bool persistent) {
  const char* value = std::getenv("GE2_FLASH_SM90_SECTION_HEADS");
  const long long n = value != nullptr ? std::strtoll(value, nullptr, 10) : 0;
  if (n >= 1) return static_cast<int>(std::min<long long>(n, s.batch * s.heads_q));
  if (!persistent || s.causal || blocks > 8) return fit;
  return static_cast<int>(std::min<int64_t>(fit, (ctas + blocks - 1) / blocks));
}

template <int kHeadDim, typename Element>
void launch(const ForwardArgs& args, cudaStream_t stream) {
  using T = Traits<kHeadDim, Element>;
  const attention::Shape& s = args.shape;
  Params<T> p{};
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.q, s, s.heads_q, s.seq_q),
                          take<0, 2>(typename T::SmemLayoutQBuffers{}), cute::Shape<Int<T::kBlockM>, Int<kHeadDim>>{},
                          _1{});
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.k, s, s.heads_kv, s.seq_k),
                          take<0, 2>(typename T::SmemLayoutKV{}), cute::Shape<Int<T::kBlockN>, Int<kHeadDim>>{}, _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.v, s, s.heads_kv, s.seq_k),
                          take<0, 2>(typename T::SmemLayoutKV{}), cute::Shape<Int<T::kBlockN>, Int<kHeadDim>>{}, _1{});
  p.tma_o = make_tma_copy(SM90_TMA_STORE{}, gmem_view<T>(args.o, s, s.heads_q, s.seq_q),
                          typename T::SmemLayoutOStore{}, cute::Shape<Int<T::kStoreRows>, Int<kHeadDim>>{}, _1{});
  p.lse = args.lse;
  p.batch = int32_t(s.batch);
  p.heads_q = int32_t(s.heads_q);
  p.heads_kv = int32_t(s.heads_kv);
  p.seq_q = int32_t(s.seq_q);
  p.seq_k = int32_t(s.seq_k);
  p.scale_log2 = s.scale * flash::kLog2e;
  p.causal = s.causal;

  constexpr int bytes = sizeof(typename T::SharedStorage);
  static_assert(bytes <= kSharedMemoryBytes, "the forward's tiles exceed an sm_90 CTA's shared memory");
  // The softmax takes the raw scores' max (scale > 0) or min (scale < 0; launch_flash_sm90_forward refuses 0).
  void (*kernel)(Params<T>) = s.scale < 0.0f ? forward_kernel<T, true> : forward_kernel<T, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "attention",
             "cudaFuncSetAttribute(flash_sm90 forward shared memory)");
  const int64_t m_blocks = (s.seq_q + T::kBlockM - 1) / T::kBlockM;
  const int64_t work_items = s.batch * s.heads_q * m_blocks;
  if (work_items > INT32_MAX) {
    throw std::invalid_argument("flash_sm90: batch x heads_q x query blocks of 128 must stay under 2^31, got " +
                                std::to_string(work_items));
  }
  p.m_blocks = int32_t(m_blocks);
  p.work_items = int32_t(work_items);
  const bool persistent = T::kPersistent && persistent_forward(s);
  const int64_t ctas = persistent ? std::min<int64_t>(work_items, multiprocessors()) : work_items;
  p.heads_per_section = forward_heads_per_section(
      heads_per_l2_section(2 * s.seq_k * kHeadDim * int64_t(sizeof(Element)), s.batch * s.heads_q), s, m_blocks, ctas,
      persistent);
  kernel<<<static_cast<unsigned>(ctas), T::kThreads, bytes, stream>>>(p);
}

}  // namespace ge2::attention::flash_sm90
