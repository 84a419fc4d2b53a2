// flash_sm90 backward (compiled for sm_90a only, on CuTe): dK, dV and the float32 dQ accumulator from dO, Q, K, V,
// the forward's lse and D_i = dO_i . O_i (flash's row_dot kernel writes D and zeroes the accumulator before, its
// dq_store kernel scales and rounds dQ after). A CTA owns kBlockN = 128 key rows (64 at head_dim 256) of one
// (batch, K/V head) and walks the query tiles of kBlockM rows that see them, for every query head of the group, so dK
// and dV have one writer. It is three warpgroups. Warpgroup 0's first thread loads K and V once and the Q and dO
// tiles by TMA into a kStages-deep ring (full and empty mbarriers, as in the forward), and its second warp the tile's
// lse and D into the same stage (the full barrier waits for both); up to head_dim 128 its third warp adds each step's
// dQ tile to the float32 accumulator (below). Warpgroups 1 and 2 own 64 keys each (head_dim
// 256: the same 64 keys, half of the queries of S^T and dP^T, half of the columns of dK and dV); per query tile
// they run
//   S^T = K Q^T and dP^T = V dO^T on wgmma from shared memory, then in float32 registers P^T = exp(scale S^T - lse)
//   and dS^T = P^T (dP^T - D);
//   dV += P^T dO, dQ_tile = dS K and dK += dS^T Q, issued in that order: dV and dK on wgmma with P^T and dS^T from
//   registers (16-bit; head_dim 256: from shared memory, double-buffered, after a barrier of the two warpgroups), dK
//   and dV in registers; dQ from dS^T in shared memory (double-buffered, by stmatrix, after a barrier of the two
//   warpgroups), split by query rows (head_dim 64: 128-row tiles) or by head_dim halves (128 and 256: 64-row tiles)
//   over the two warpgroups, and sent out while dK runs. Up to head_dim 128 the consumers write it to shared memory,
//   float32, and one thread of the producer's third warp adds it to the accumulator by a TMA reduce-add (as
//   FlashAttention-3 does): the consumers go on instead of waiting on global atomics, which stalled their registers'
//   reuse (ncu: L1TEX long scoreboard, the top stall). At head_dim 256 shared memory is full: 8-byte atomics.
// Causal skips the query tiles that see none of the CTA's keys; scores outside a row's visible keys get P = 0. TMA
// reads rows past seq_q or seq_k as zeros: such keys see no query (their dK, dV are not written) and such queries'
// P is 0.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cutlass/arch/barrier.h>

#include "flash_sm90.cuh"

namespace ge2::attention::flash_sm90 {

using namespace cute;

template <int kHeadDim_, typename Element_>
struct BackwardTraits {
  using Element = Element_;  // cutlass::half_t or cutlass::bfloat16_t
  static constexpr int kHeadDim = kHeadDim_;
  // Up to head_dim 128 a CTA owns 128 keys, 64 per consumer warpgroup, which holds their dK and dV rows in registers
  // and gets P^T and dS^T, the A operands of dV += P^T dO and dK += dS^T Q, from its own S^T and dP^T in registers.
  // At head_dim 256 the dK and dV rows of 64 keys alone would take 256 float registers per thread (a consumer has
  // 232): a CTA owns 64 keys and the warpgroups split dK and dV by head_dim halves (128 floats per thread). Each then
  // computes S^T and dP^T for half of the step's queries, and P^T and dS^T, which dV and dK need whole, go through
  // shared memory (wgmma reads A from there).
  static constexpr bool kScoresInSharedMemory = kHeadDim == 256;
  static constexpr int kBlockN = kScoresInSharedMemory ? 64 : 128;  // key rows per CTA
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;          // query rows per step: the accumulators fit
  static constexpr int kStages = 2;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // The consumer warpgroups along the keys (of S^T, dP^T, dK, dV), and along S^T's queries and dK's, dV's columns.
  static constexpr int kKeyGroups = kBlockN / 64;
  static constexpr int kQueryGroups = kConsumerWarpgroups / kKeyGroups;
  // dQ's tile split over the consumer warpgroups: by 64-row halves when kBlockM is 128, else by head_dim halves.
  static constexpr int kDqRowGroups = kBlockM / 64;
  static constexpr int kDqColumnGroups = kConsumerWarpgroups / kDqRowGroups;

  using TileSdP = cute::Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>;  // S^T, dP^T: keys x queries
  using TileKV = cute::Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>;   // dK, dV: keys x head_dim
  using TileDQ = cute::Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;   // dQ: queries x head_dim
  using ScoreWarpgroups = Layout<cute::Shape<Int<kKeyGroups>, Int<kQueryGroups>, _1>>;  // also dK's and dV's
  using DqWarpgroups = Layout<cute::Shape<Int<kDqRowGroups>, Int<kDqColumnGroups>, _1>>;
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, cute::Shape<_64, Int<kBlockM / kQueryGroups>, Int<kHeadDim>>>(),
      ScoreWarpgroups{}));
  // A is P^T or dS^T (K-major), from registers or shared memory; B is dO or Q stored [query][dim], read as
  // (dim x query): MN-major.
  using TileKVWarpgroup = cute::Shape<_64, Int<kHeadDim / kQueryGroups>, Int<kBlockM>>;
  using MmaKVOp = std::conditional_t<
      kScoresInSharedMemory,
      decltype(GMMA::ss_op_selector<Element, Element, float, TileKVWarpgroup, GMMA::Major::K, GMMA::Major::MN>()),
      decltype(GMMA::rs_op_selector<Element, Element, float, TileKVWarpgroup, GMMA::Major::K, GMMA::Major::MN>())>;
  using MmaKV = decltype(make_tiled_mma(MmaKVOp{}, ScoreWarpgroups{}));
  // A is dS stored [key][query], read as (query x key); B is K stored [key][dim], read as (dim x key): both MN-major.
  using MmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           cute::Shape<Int<kBlockM / kDqRowGroups>, Int<kHeadDim / kDqColumnGroups>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      DqWarpgroups{}));

  // 128-byte swizzled rows, as in the forward; the transposed views are the same bytes read the other way.
  using SmemLayoutKV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                              cute::Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(cute::Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             cute::Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{},
      make_ordered_layout(cute::Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutDs = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                              cute::Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  using SmemLayoutDsT = decltype(composition(
      SmemLayoutDs{}, make_ordered_layout(cute::Shape<Int<kBlockM>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));
  // P^T and dS^T (and at the end dK and dV) go from the accumulators' registers to shared memory by stmatrix, 16
  // bytes a thread per instruction: an element-wise copy into the swizzled view computes its addresses as integers,
  // which loses the shared address space, and compiled to 4-byte generic stores (ST.E).
  using SmemCopyAccumulators = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  // The step's dQ tile in float32, rows of 32 floats in the 128-byte swizzle, which TMA reads back (4 boxes of 32
  // columns at head_dim 128). The swizzle spreads a warp's 8-byte stores of 8 rows over all banks.
  static constexpr bool kDqInSharedMemory = !kScoresInSharedMemory;  // head_dim 256: 224 of the 227 KB are taken
  using SmemLayoutDQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{},
                                              cute::Shape<Int<kBlockM>, Int<kHeadDim>>{}));

  // Global tensors as (seq, dim, head, batch) with element strides, as in the forward.
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemShape{},
                                          GmemStride{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutKV{},
                                       cute::Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // dK and dV leave as K and V came, through their tiles' shared memory.
  using TmaKVStore = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutKV{},
                                            cute::Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      cute::Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using DqGmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)), GmemShape{}, GmemStride{}));
  using TmaDQ = decltype(make_tma_copy(SM90_TMA_REDUCE_ADD{}, DqGmemTensor{}, SmemLayoutDQ{},
                                       cute::Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);  // K and V, each
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);   // one Q or dO tile

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutDs>, 1024> ds;
    cute::array_aligned<Element, kScoresInSharedMemory ? cosize_v<SmemLayoutDs> : 1, 1024> p;  // P^T, as dS^T
    cute::array_aligned<float, kDqInSharedMemory ? cosize_v<SmemLayoutDQ> : 1, 1024> dq;
    float lse[kStages][kBlockM], row_dot[kStages][kBlockM];  // of the stage's query rows (0 past seq_q)
    alignas(8) uint64_t kv_full;
    uint64_t q_full[kStages], dout_full[kStages], q_empty[kStages], dout_empty[kStages];
  };
  static constexpr int kStatisticsLanes = 32;  // the producer's second warp: lse and D into shared memory
  // Named barriers of the consumers (dS^T written) and of the consumers with the producer's dQ warp (the dQ tile
  // written; the dQ buffer read by TMA, free again).
  static constexpr uint32_t kScoresWrittenBarrier = 0, kDqFullBarrier = 1, kDqEmptyBarrier = 2;
  static constexpr int kDqBarrierThreads = kConsumerThreads + 32;
};

template <class T>
struct BackwardParams {
  typename T::TmaKV tma_k, tma_v;
  typename T::TmaQ tma_q, tma_dout;
  typename T::TmaDQ tma_dq;    // up to head_dim 128: onto dq_accumulator
  attention::Shape shape;
  const float* lse;            // [batch, heads_q, seq_q]
  const float* row_dot;        // D, as lse
  float* dq_accumulator;       // [batch, heads_q, seq_q, head_dim]
  typename T::TmaKVStore tma_dk, tma_dv;  // K's strides
  float scale_log2;  // scale * log2(e): P = exp2(scale_log2 s - log2(e) lse)
  int32_t heads_per_section;  // of batch x heads_kv, for l2_sectioned_head_block
};

// Two adjacent floats into shared memory, 8 bytes at a shared-space address: through CuTe's swizzled view a plain
// store would be generic (the swizzle computes the address as an integer).
__device__ __forceinline__ void store_shared_pair(uint32_t address, float first, float second) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(first), "f"(second));
}

// A thread's dQ tile in shared memory, ((2, 2, N/8), MMA_M, MMA_N) as its accumulator, in the 128-byte swizzle of
// 32-float rows (address bits 4-6 ^= bits 7-9): the byte offset of pair i from the pair of its column block mod 4 in
// the first row half. Row halves (8 rows), 32-column blocks and the MMA tiles are multiples of 1024 bytes, which the
// swizzle does not change; the static_assert checks it for every pair of the (unswizzled, static) layout.
template <class Layout, int... kPairs>
constexpr bool dq_offsets_are_swizzle_free(Layout layout, std::integer_sequence<int, kPairs...>) {
  return (((layout(2 * kPairs) - layout(2 * kPairs / 4 % 4 * 4)) % 256 == 0) && ...);
}

template <class Layout>
__device__ __forceinline__ constexpr uint32_t dq_chunk_offset(Layout layout, int i) {
  static_assert(is_static<Layout>::value && dq_offsets_are_swizzle_free(
                    Layout{}, std::make_integer_sequence<int, decltype(size(Layout{}))::value / 2>{}),
                "a dQ pair's offset from its chunk would cross the swizzle's bits");
  return uint32_t(layout(i) - layout(i / 4 % 4 * 4)) * sizeof(float);
}

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1) backward_kernel(CUTE_GRID_CONSTANT BackwardParams<T> const p) {
  using Element = typename T::Element;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TransactionBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kHeadDim = T::kHeadDim, kStages = T::kStages;
  const attention::Shape& s = p.shape;

  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  auto& smem = *reinterpret_cast<typename T::SharedStorage*>(shared_bytes);
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename T::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename T::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename T::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename T::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename T::SmemLayoutQ{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename T::SmemLayoutQt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename T::SmemLayoutDs{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename T::SmemLayoutDsT{});
  Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename T::SmemLayoutDs{});  // head_dim 256 only
  Tensor sdQ = make_tensor(make_smem_ptr(smem.dq.data()), typename T::SmemLayoutDQ{});  // up to head_dim 128

  // Causal: key block 0 sees the most query tiles and starts first.
  const HeadBlock work = l2_sectioned_head_block(int(blockIdx.y * gridDim.x + blockIdx.x), int(s.batch * s.heads_kv),
                                                int(gridDim.y), p.heads_per_section);
  const int n_block = work.block;
  const int bhk = work.head, b = bhk / int(s.heads_kv), hk = bhk % int(s.heads_kv);
  const int group = int(s.heads_q / s.heads_kv);
  const int n0 = n_block * kBlockN;
  // Steps: (query head of the group, query tile) over the tiles holding a row that sees one of the CTA's keys, from
  // the rows of its first key to those of its last (both bounds grow with the key).
  const int last_key = min(int(s.seq_k), n0 + kBlockN) - 1;
  const int query_begin = int(s.query_begin(n0)), query_end = int(s.query_end(last_key));
  const int first_tile = query_begin / kBlockM;
  const int tiles_per_head = query_end > query_begin && query_begin < s.seq_q
                                 ? (query_end + kBlockM - 1) / kBlockM - first_tile : 0;
  const int steps = group * tiles_per_head;

  const int warpgroup = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    // The TMA descriptors into the cache now, not at each one's first copy (as CUTLASS's kernels do).
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_dout.get_tma_descriptor());
    if constexpr (T::kDqInSharedMemory) prefetch_tma_descriptor(p.tma_dq.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_dk.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_dv.get_tma_descriptor());
    Barrier::init(&smem.kv_full, 1);
    CUTE_UNROLL
    for (int stage = 0; stage < kStages; ++stage) {
      Barrier::init(&smem.q_full[stage], 1 + T::kStatisticsLanes);  // TMA's thread and the statistics warp
      Barrier::init(&smem.dout_full[stage], 1);
      Barrier::init(&smem.q_empty[stage], T::kConsumerThreads);
      Barrier::init(&smem.dout_empty[stage], T::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    using cutlass::arch::NamedBarrier;
    constexpr int kDqWarpEnd = T::kDqInSharedMemory ? 96 : 64;
    if (steps == 0 || threadIdx.x >= kDqWarpEnd) return;
    if (threadIdx.x >= 64) {  // the third warp: each step's dQ tile from shared memory onto the accumulator
      Tensor mdQ =
          p.tma_dq.get_tma_tensor(make_shape(int32_t(s.seq_q), kHeadDim, int32_t(s.heads_q), int32_t(s.batch)));
      auto cta_dq = p.tma_dq.get_slice(_0{});
      Tensor tdQsdQ = cta_dq.partition_S(sdQ);
      NamedBarrier::arrive(T::kDqBarrierThreads, T::kDqEmptyBarrier);  // the buffer starts free
      for (int step = 0; step < steps; ++step) {
        const int h = hk * group + step / tiles_per_head, m_tile = first_tile + step % tiles_per_head;
        Tensor gdQ = local_tile(mdQ(_, _, h, b), cute::Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_tile, _0{}));
        NamedBarrier::sync(T::kDqBarrierThreads, T::kDqFullBarrier);
        if (threadIdx.x == 64) {  // rows past seq_q are not written: the tensor's bounds clip the boxes
          copy(p.tma_dq, tdQsdQ, cta_dq.partition_D(gdQ));
          tma_store_arrive();
          tma_store_wait<0>();  // TMA has read the buffer (before the consumers overwrite it, or the CTA exits)
        }
        __syncwarp();
        if (step + 1 < steps) NamedBarrier::arrive(T::kDqBarrierThreads, T::kDqEmptyBarrier);
      }
      return;
    }
    if (threadIdx.x >= 32) {  // lse and D of each step's query rows, read by the consumers' softmax
      const int lane = static_cast<int>(threadIdx.x) - 32;
      for (int step = 0; step < steps; ++step) {
        const int stage = step % kStages;
        const int h = hk * group + step / tiles_per_head, m0 = (first_tile + step % tiles_per_head) * kBlockM;
        const int64_t row0 = (int64_t(b) * s.heads_q + h) * s.seq_q;
        Barrier::wait(&smem.q_empty[stage], ((step / kStages) & 1) ^ 1);
        for (int i = lane; i < kBlockM; i += T::kStatisticsLanes) {
          const bool valid = m0 + i < s.seq_q;
          smem.lse[stage][i] = valid ? p.lse[row0 + m0 + i] : 0.0f;
          smem.row_dot[stage][i] = valid ? p.row_dot[row0 + m0 + i] : 0.0f;
        }
        Barrier::arrive(&smem.q_full[stage]);  // releases the stores above to the waiting consumers
      }
      return;
    }
    if (threadIdx.x != 0) return;
    Tensor mK = p.tma_k.get_tma_tensor(make_shape(int32_t(s.seq_k), kHeadDim, int32_t(s.heads_kv), int32_t(s.batch)));
    Tensor mV = p.tma_v.get_tma_tensor(make_shape(int32_t(s.seq_k), kHeadDim, int32_t(s.heads_kv), int32_t(s.batch)));
    Tensor mQ = p.tma_q.get_tma_tensor(make_shape(int32_t(s.seq_q), kHeadDim, int32_t(s.heads_q), int32_t(s.batch)));
    Tensor mdO =
        p.tma_dout.get_tma_tensor(make_shape(int32_t(s.seq_q), kHeadDim, int32_t(s.heads_q), int32_t(s.batch)));
    using KVTile = cute::Shape<Int<kBlockN>, Int<kHeadDim>>;
    using QTile = cute::Shape<Int<kBlockM>, Int<kHeadDim>>;
    Tensor gK = local_tile(mK(_, _, hk, b), KVTile{}, make_coord(n_block, _0{}));
    Tensor gV = local_tile(mV(_, _, hk, b), KVTile{}, make_coord(n_block, _0{}));
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    auto cta_q = p.tma_q.get_slice(_0{});
    auto cta_dout = p.tma_dout.get_slice(_0{});
    Tensor tQsQ = cta_q.partition_D(sQ);  // (TMA, TMA_M, TMA_D, stage)
    Tensor tdOsdO = cta_dout.partition_D(sdO);

    TransactionBarrier::arrive_and_expect_tx(&smem.kv_full, 2 * T::kKVBytes);
    copy(p.tma_k.with(smem.kv_full), cta_k.partition_S(gK), cta_k.partition_D(sK));
    copy(p.tma_v.with(smem.kv_full), cta_v.partition_S(gV), cta_v.partition_D(sV));
    for (int step = 0; step < steps; ++step) {
      const int stage = step % kStages;
      const uint32_t phase = (step / kStages) & 1;
      const int h = hk * group + step / tiles_per_head, m_tile = first_tile + step % tiles_per_head;
      Tensor gQ = local_tile(mQ(_, _, h, b), QTile{}, make_coord(m_tile, _0{}));
      Tensor gdO = local_tile(mdO(_, _, h, b), QTile{}, make_coord(m_tile, _0{}));
      Barrier::wait(&smem.q_empty[stage], phase ^ 1);  // the first pass finds every stage free
      TransactionBarrier::arrive_and_expect_tx(&smem.q_full[stage], T::kQBytes);
      copy(p.tma_q.with(smem.q_full[stage]), cta_q.partition_S(gQ), tQsQ(_, _, _, stage));
      Barrier::wait(&smem.dout_empty[stage], phase ^ 1);
      TransactionBarrier::arrive_and_expect_tx(&smem.dout_full[stage], T::kQBytes);
      copy(p.tma_dout.with(smem.dout_full[stage]), cta_dout.partition_S(gdO), tdOsdO(_, _, _, stage));
    }
    return;
  }

  // consumers
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int thread = static_cast<int>(threadIdx.x) - 128;
  typename T::MmaSdP mma_sdp;
  typename T::MmaKV mma_kv;
  typename T::MmaDQ mma_dq;
  auto thread_sdp = mma_sdp.get_thread_slice(thread);
  auto thread_kv = mma_kv.get_thread_slice(thread);
  auto thread_dq = mma_dq.get_thread_slice(thread);
  Tensor tSrK = thread_sdp.partition_fragment_A(sK);     // descriptors
  Tensor tSrV = thread_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thread_sdp.partition_fragment_B(sQ);     // (MMA, MMA_N, MMA_K, stage)
  Tensor tSrdO = thread_sdp.partition_fragment_B(sdO);
  Tensor tKVrQt = thread_kv.partition_fragment_B(sQt);   // (MMA, MMA_N, MMA_K, stage)
  Tensor tKVrdOt = thread_kv.partition_fragment_B(sdOt);
  Tensor tQrdS = thread_dq.partition_fragment_A(sdSt);   // (MMA, MMA_M, MMA_K, buffer)
  Tensor tQrKt = thread_dq.partition_fragment_B(sKt);
  auto score_store = make_tiled_copy_C(typename T::SmemCopyAccumulators{}, mma_sdp);
  auto thread_score_store = score_store.get_thread_slice(thread);
  Tensor tSsdS = thread_score_store.partition_D(sdS);    // this thread's dS^T elements, (CPY, CPY_M, CPY_N, buffer)
  Tensor tQsdQ = thread_dq.partition_C(sdQ);             // this thread's dQ elements, as its accumulator
  // Shared-memory addresses of the thread's dQ pairs: 4 swizzled chunks (by column block mod 4) plus offsets that
  // leave the swizzle alone (dq_chunk_offset), instead of one address register per pair (which spilled).
  uint32_t dq_chunks[4];
  if constexpr (T::kDqInSharedMemory) {
    static_assert(size<0, 0>(tQsdQ) == 2 && size<0, 2>(tQsdQ) % 4 == 0, "((column pair, row half, column block), ...)");
    CUTE_UNROLL
    for (int block = 0; block < 4; ++block) dq_chunks[block] = cast_smem_ptr_to_uint(&tQsdQ(4 * block));
  }

  Tensor tdKrdK = partition_fragment_C(mma_kv, select<0, 1>(typename T::TileKV{}));
  Tensor tdVrdV = partition_fragment_C(mma_kv, select<0, 1>(typename T::TileKV{}));
  clear(tdKrdK);
  clear(tdVrdV);
  // (key, query) in the tile of every score element of this thread, as (rows, columns)
  Tensor tScS = thread_sdp.partition_C(make_identity_tensor(select<0, 1>(typename T::TileSdP{})));
  Tensor score_coordinates = make_tensor(tScS.data(), rows_by_columns(tScS.layout()));
  constexpr int kRows = size<0>(decltype(score_coordinates.layout()){});  // 2 keys

  // The query rows that see each of the thread's keys, [query_from, query_to) (none for keys past seq_k).
  int query_from[kRows], query_to[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int key = n0 + get<0>(score_coordinates(r, 0));
    query_from[r] = key < s.seq_k ? int(s.query_begin(key)) : 0;
    query_to[r] = key < s.seq_k ? int(s.query_end(key)) : 0;
  }
  constexpr int kScores = decltype(size(partition_fragment_C(mma_sdp, select<0, 1>(typename T::TileSdP{}))))::value;
  cutlass::NumericArrayConverter<Element, float, kScores> to_element;
  using ScoreArray = cutlass::Array<float, kScores>;

  if (steps > 0) Barrier::wait(&smem.kv_full, 0);
  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages, buffer = step & 1;
    const uint32_t phase = (step / kStages) & 1;
    const int m0 = (first_tile + step % tiles_per_head) * kBlockM;

    // S^T = K Q^T and dP^T = V dO^T, two batches: the softmax of S^T runs while dP^T is computed.
    Tensor tSrS = partition_fragment_C(mma_sdp, select<0, 1>(typename T::TileSdP{}));
    Tensor tSrdP = partition_fragment_C(mma_sdp, select<0, 1>(typename T::TileSdP{}));
    Barrier::wait(&smem.q_full[stage], phase);
    issue_warpgroup_gemm<true, false>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
    Barrier::wait(&smem.dout_full[stage], phase);
    issue_warpgroup_gemm<true, false>(mma_sdp, tSrV, tSrdO(_, _, _, stage), tSrdP);

    // P^T = exp(scale S^T - lse) over the visible (key, query) pairs, 0 elsewhere.
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    Tensor scores = make_tensor(tSrS.data(), rows_by_columns(tSrS.layout()));
    CUTE_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) {
      const int column = get<1>(score_coordinates(0, c)), query = m0 + column;
      const float lse_log2 = smem.lse[stage][column] * flash::kLog2e;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const bool visible = query >= query_from[r] && query < query_to[r];
        scores(r, c) = visible ? exp2f(scores(r, c) * p.scale_log2 - lse_log2) : 0.0f;
      }
    }
    // dS^T = P^T (dP^T - D).
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrdP);
    Tensor dp = make_tensor(tSrdP.data(), rows_by_columns(tSrdP.layout()));
    CUTE_UNROLL
    for (int c = 0; c < size<1>(dp); ++c) {
      const float row_dot = smem.row_dot[stage][get<1>(score_coordinates(0, c))];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) dp(r, c) = scores(r, c) * (dp(r, c) - row_dot);
    }

    // dV += P^T dO, dQ_tile = dS K and dK += dS^T Q, in that order, P^T and dS^T rounded to the input dtype once.
    // dS^T also goes to shared memory for dQ, which reads the other warpgroup's keys too: the async proxy (wgmma)
    // must see both warpgroups' writes. The buffers alternate, so a warpgroup a step ahead never overwrites the dS
    // (or P) that the other one still reads (it waits at the next barrier for that one's gemms to be done). dK is
    // issued last, so that dQ goes out while it runs.
    auto p_values = to_element(*reinterpret_cast<ScoreArray const*>(tSrS.data()));
    auto ds_values = to_element(*reinterpret_cast<ScoreArray const*>(tSrdP.data()));
    Tensor ds_register = make_tensor(make_rmem_ptr<Element>(ds_values.data()), tSrdP.layout());
    Tensor tKVrP = make_tensor(make_rmem_ptr<Element>(p_values.data()), accumulator_as_a_operand(tSrS.layout()));
    Tensor tKVrdS = make_tensor(make_rmem_ptr<Element>(ds_values.data()), accumulator_as_a_operand(tSrdP.layout()));
    if constexpr (T::kScoresInSharedMemory) {  // this warpgroup's queries of P^T and dS^T; dV and dK read all
      Tensor tKVsP = thread_kv.partition_fragment_A(sP);  // descriptors, (MMA, MMA_M, MMA_K, buffer)
      Tensor tSsP = thread_score_store.partition_D(sP);
      Tensor p_register = make_tensor(make_rmem_ptr<Element>(p_values.data()), tSrS.layout());
      copy(score_store, thread_score_store.retile_S(p_register), tSsP(_, _, _, buffer));
      copy(score_store, thread_score_store.retile_S(ds_register), tSsdS(_, _, _, buffer));
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, T::kScoresWrittenBarrier);
      issue_warpgroup_gemm<false, false>(mma_kv, tKVsP(_, _, _, buffer), tKVrdOt(_, _, _, stage), tdVrdV);
    } else {
      issue_warpgroup_gemm<false, true>(mma_kv, tKVrP, tKVrdOt(_, _, _, stage), tdVrdV);
      copy(score_store, thread_score_store.retile_S(ds_register), tSsdS(_, _, _, buffer));
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, T::kScoresWrittenBarrier);
    }
    Tensor tQrdQ = partition_fragment_C(mma_dq, select<0, 1>(typename T::TileDQ{}));
    issue_warpgroup_gemm<true, false>(mma_dq, tQrdS(_, _, _, buffer), tQrKt, tQrdQ);
    if constexpr (T::kScoresInSharedMemory) {
      Tensor tKVsdS = thread_kv.partition_fragment_A(sdS);
      issue_warpgroup_gemm<false, false>(mma_kv, tKVsdS(_, _, _, buffer), tKVrQt(_, _, _, stage), tdKrdK);
    } else {
      issue_warpgroup_gemm<false, true>(mma_kv, tKVrdS, tKVrQt(_, _, _, stage), tdKrdK);
    }
    warpgroup_wait<1>();  // dV and dQ are done, dK runs on: dO's stage is free
    warpgroup_fence_operand(tdVrdV);
    warpgroup_fence_operand(tQrdQ);
    Barrier::arrive(&smem.dout_empty[stage]);

    if constexpr (T::kDqInSharedMemory) {
      // dQ_tile to shared memory, once the dQ warp's TMA has read the previous one, then handed to that warp (the
      // async proxy must see the stores). Rows past seq_q hold zeros (their P is 0) and are not added.
      cutlass::arch::NamedBarrier::sync(T::kDqBarrierThreads, T::kDqEmptyBarrier);
      CUTE_UNROLL
      for (int i = 0; i < size(tQrdQ); i += 2) {
        store_shared_pair(dq_chunks[(i / 4) % 4] + dq_chunk_offset(tQsdQ.layout(), i), tQrdQ(i), tQrdQ(i + 1));
      }
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::arrive(T::kDqBarrierThreads, T::kDqFullBarrier);
    } else {
      // head_dim 256: dQ_tile into the float32 accumulator, a thread's column pairs (c, c + 1) by 8-byte atomics.
      Tensor tQcdQ = thread_dq.partition_C(make_identity_tensor(select<0, 1>(typename T::TileDQ{})));
      Tensor dq = make_tensor(tQrdQ.data(), rows_by_columns(tQrdQ.layout()));
      Tensor dq_coordinates = make_tensor(tQcdQ.data(), rows_by_columns(tQcdQ.layout()));
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dq); ++r) {
        const int query = m0 + get<0>(dq_coordinates(r, 0));
        if (query >= s.seq_q) continue;
        const int h = hk * group + step / tiles_per_head;
        float* accumulator_row = p.dq_accumulator + ((int64_t(b) * s.heads_q + h) * s.seq_q + query) * kHeadDim;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dq); c += 2) {
          atomicAdd(reinterpret_cast<float2*>(accumulator_row + get<1>(dq_coordinates(r, c))),
                    make_float2(dq(r, c), dq(r, c + 1)));
        }
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tdKrdK);
    if constexpr (!T::kScoresInSharedMemory) {
      warpgroup_fence_operand(tKVrP);
      warpgroup_fence_operand(tKVrdS);
    }
    Barrier::arrive(&smem.q_empty[stage]);
  }

  // dK = scale * sum dS^T Q and dV, rounded once, into K's and V's shared memory by stmatrix, once both warpgroups
  // are past their last gemms (which read all of K and V), then one TMA store each: keys past seq_k are clipped, keys
  // that no query sees get zeros.
  CUTE_UNROLL
  for (int i = 0; i < size(tdKrdK); ++i) tdKrdK(i) *= s.scale;
  constexpr int kKVValues = decltype(size(tdKrdK))::value;
  cutlass::NumericArrayConverter<Element, float, kKVValues> kv_to_element;
  using KVArray = cutlass::Array<float, kKVValues>;
  auto dk_values = kv_to_element(*reinterpret_cast<KVArray const*>(tdKrdK.data()));
  auto dv_values = kv_to_element(*reinterpret_cast<KVArray const*>(tdVrdV.data()));
  auto kv_store = make_tiled_copy_C(typename T::SmemCopyAccumulators{}, mma_kv);
  auto thread_kv_store = kv_store.get_thread_slice(thread);
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, T::kScoresWrittenBarrier);
  copy(kv_store, thread_kv_store.retile_S(make_tensor(make_rmem_ptr<Element>(dk_values.data()), tdKrdK.layout())),
       thread_kv_store.partition_D(sK));
  copy(kv_store, thread_kv_store.retile_S(make_tensor(make_rmem_ptr<Element>(dv_values.data()), tdVrdV.layout())),
       thread_kv_store.partition_D(sV));
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(T::kConsumerThreads, T::kScoresWrittenBarrier);
  if (thread == 0) {
    const auto kv_shape = make_shape(int32_t(s.seq_k), kHeadDim, int32_t(s.heads_kv), int32_t(s.batch));
    Tensor mdK = p.tma_dk.get_tma_tensor(kv_shape);
    Tensor mdV = p.tma_dv.get_tma_tensor(kv_shape);
    using KVTile = cute::Shape<Int<kBlockN>, Int<kHeadDim>>;
    auto cta_dk = p.tma_dk.get_slice(_0{});
    auto cta_dv = p.tma_dv.get_slice(_0{});
    Tensor gdK = local_tile(mdK(_, _, hk, b), KVTile{}, make_coord(n_block, _0{}));
    Tensor gdV = local_tile(mdV(_, _, hk, b), KVTile{}, make_coord(n_block, _0{}));
    copy(p.tma_dk, cta_dk.partition_S(sK), cta_dk.partition_D(gdK));
    copy(p.tma_dv, cta_dv.partition_S(sV), cta_dv.partition_D(gdV));
    tma_store_arrive();
    tma_store_wait<0>();
  }
}

template <int kHeadDim, typename Element>
void launch_backward(const BackwardArgs& args, const float* row_dot, float* dq_accumulator, cudaStream_t stream) {
  using T = BackwardTraits<kHeadDim, Element>;
  const attention::Shape& s = args.shape;
  BackwardParams<T> p{};
  using KVTile = cute::Shape<Int<T::kBlockN>, Int<kHeadDim>>;
  using QTile = cute::Shape<Int<T::kBlockM>, Int<kHeadDim>>;
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.k, s, s.heads_kv, s.seq_k), typename T::SmemLayoutKV{},
                          KVTile{}, _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.v, s, s.heads_kv, s.seq_k), typename T::SmemLayoutKV{},
                          KVTile{}, _1{});
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.q, s, s.heads_q, s.seq_q),
                          take<0, 2>(typename T::SmemLayoutQ{}), QTile{}, _1{});
  p.tma_dout = make_tma_copy(SM90_TMA_LOAD{}, gmem_view<T>(args.dout, s, s.heads_q, s.seq_q),
                             take<0, 2>(typename T::SmemLayoutQ{}), QTile{}, _1{});
  if constexpr (T::kDqInSharedMemory) {  // the accumulator as (seq, dim, head, batch), float32, row-major
    const auto accumulator = make_tensor(
        make_gmem_ptr(dq_accumulator),
        make_shape(int32_t(s.seq_q), int32_t(kHeadDim), int32_t(s.heads_q), int32_t(s.batch)),
        make_stride(int64_t(kHeadDim), _1{}, s.seq_q * kHeadDim, s.heads_q * s.seq_q * kHeadDim));
    p.tma_dq = make_tma_copy(SM90_TMA_REDUCE_ADD{}, accumulator, typename T::SmemLayoutDQ{}, QTile{}, _1{});
  }
  p.shape = s;
  p.lse = args.lse;
  p.row_dot = row_dot;
  p.dq_accumulator = dq_accumulator;
  p.tma_dk = make_tma_copy(SM90_TMA_STORE{}, gmem_view<T>(args.dk, s, s.heads_kv, s.seq_k),
                           typename T::SmemLayoutKV{}, KVTile{}, _1{});
  p.tma_dv = make_tma_copy(SM90_TMA_STORE{}, gmem_view<T>(args.dv, s, s.heads_kv, s.seq_k),
                           typename T::SmemLayoutKV{}, KVTile{}, _1{});
  p.scale_log2 = s.scale * flash::kLog2e;
  // A K/V head's blocks share its query heads' Q, dO (16-bit) and dQ accumulator (float32) rows.
  p.heads_per_section = heads_per_l2_section(
      (s.heads_q / s.heads_kv) * s.seq_q * kHeadDim * int64_t(2 * sizeof(Element) + sizeof(float)),
      s.batch * s.heads_kv);

  constexpr int bytes = sizeof(typename T::SharedStorage);
  static_assert(bytes <= kSharedMemoryBytes, "the backward's tiles exceed an sm_90 CTA's shared memory");
  check_cuda(cudaFuncSetAttribute(backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "attention", "cudaFuncSetAttribute(flash_sm90 backward shared memory)");
  const dim3 grid(static_cast<unsigned>(s.batch * s.heads_kv),
                  static_cast<unsigned>((s.seq_k + T::kBlockN - 1) / T::kBlockN));
  backward_kernel<T><<<grid, T::kThreads, bytes, stream>>>(p);
}

}  // namespace ge2::attention::flash_sm90
