// Candidates warp_row and block_row: the row is read once into registers, then max, sum of exponentials, loss and
// gradient all come from those registers, so forward+backward costs one read and one write of the logits.
//   warp_row:  one warp per row (short rows, up to 4 packs per lane), 8 rows per 256-thread block.
//   block_row: one block per row (long rows, up to 8 packs per thread), 256 to 1024 threads by row length.
// Both run a persistent grid (rows strided over the blocks that fit at once), so the per-block partial losses of
// "sum"/"mean" fit in a fixed workspace and are added in a fixed order.
#include "kernels/row_common.cuh"

namespace ge2::cross_entropy {
namespace {

template <int kGroup>
__device__ __forceinline__ float group_reduce_max(float value, float* scratch) {
  if constexpr (kGroup == 32) {
    return warp_reduce(value, MaxOp{});
  } else {
    return block_reduce(value, MaxOp{}, scratch);
  }
}

template <int kGroup>
__device__ __forceinline__ float group_reduce_sum(float value, float* scratch) {
  if constexpr (kGroup == 32) {
    return warp_reduce(value, SumOp{});
  } else {
    return block_reduce(value, SumOp{}, scratch);
  }
}

// Makes the packed row opaque to the optimizer, so that each pass converts (and exponentiates) the packed values
// afresh instead of keeping every float conversion of the previous pass alive across the reduction: that would
// double the registers a row needs and spill. Emits no instruction.
template <typename T, int kVec>
__device__ __forceinline__ void reload_barrier(Pack<T, kVec>& pack) {
  if constexpr (sizeof(Pack<T, kVec>) % sizeof(uint32_t) == 0) {
    auto* words = reinterpret_cast<uint32_t*>(&pack);
#pragma unroll
    for (int w = 0; w < static_cast<int>(sizeof(Pack<T, kVec>) / sizeof(uint32_t)); ++w) {
      asm volatile("" : "+r"(words[w]));
    }
  }
}

// kGroup threads (a warp, or the whole block) share a row; each holds kPacks packs of kVec elements, pack k of
// lane l covering columns [(k * kGroup + l) * kVec, + kVec). Packs past the row end are never touched.
// At most 64 registers per thread (1024 resident threads per SM): the row data is 32 of them at 8 packs.
template <typename T, typename L, int kVec, int kPacks, int kThreads, int kGroup>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads) register_rows(RowProblem p) {
  static_assert(kThreads % kGroup == 0 && kGroup % 32 == 0, "groups are whole warps");
  constexpr int kGroups = kThreads / kGroup;
  __shared__ float reduce_scratch[32];
  const T* logits = static_cast<const T*>(p.logits);
  T* dlogits = static_cast<T*>(p.dlogits);
  const int lane = threadIdx.x % kGroup, group = threadIdx.x / kGroup;
  const float upstream = uniform_upstream<T>(p);
  float running_loss = 0.0f;

  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group; row < p.rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const T* x = logits + row * p.cols;
    Pack<T, kVec> cache[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t col = (static_cast<int64_t>(k) * kGroup + lane) * kVec;
      if (col < p.cols) cache[k] = load_pack<T, kVec>(x + col);
    }
    const RowLabel label = read_label<T, L>(p, row);

    float thread_max = MaxOp::identity();
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if ((static_cast<int64_t>(k) * kGroup + lane) * kVec < p.cols) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) thread_max = fmaxf(thread_max, to_float(cache[k].values[i]));
      }
    }
    const float row_max = group_reduce_max<kGroup>(thread_max, reduce_scratch);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) reload_barrier(cache[k]);

    float thread_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if ((static_cast<int64_t>(k) * kGroup + lane) * kVec < p.cols) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) thread_sum += exp_shifted(to_float(cache[k].values[i]), row_max);
      }
    }
    const float row_sum = group_reduce_sum<kGroup>(thread_sum, reduce_scratch);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) reload_barrier(cache[k]);
    const RowOutcome outcome = finish_row<T>(p, row, label, row_max, row_sum, upstream);

    if (dlogits != nullptr) {
      T* g = dlogits + row * p.cols;
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int64_t col = (static_cast<int64_t>(k) * kGroup + lane) * kVec;
        if (col < p.cols) {
          Pack<T, kVec> out;
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            out.values[i] = from_float<T>(gradient(to_float(cache[k].values[i]), col + i, row_max, label, outcome));
          }
          store_pack<T, kVec>(g + col, out);
        }
      }
    }
    if (lane == 0) record_row<T>(p, row, label, outcome, &running_loss);
  }
  write_block_partial<kGroups>(p, lane == 0, group, running_loss);
}

template <typename T, typename L, int kVec, int kPacks, int kThreads, int kGroup>
int launch(const RowProblem& problem, cudaStream_t stream) {
  const auto kernel = register_rows<T, L, kVec, kPacks, kThreads, kGroup>;
  static const int per_sm = blocks_per_sm(kernel, kThreads);
  constexpr int kGroups = kThreads / kGroup;
  const int grid = persistent_grid(per_sm, (problem.rows + kGroups - 1) / kGroups);
  kernel<<<grid, kThreads, 0, stream>>>(problem);
  if constexpr (kGroup == 32) {
    GE2_CHECK_LAUNCH("cross_entropy warp_row");
  } else {
    GE2_CHECK_LAUNCH("cross_entropy block_row");
  }
  return grid;
}

// warp_row: 1, 2 or 4 packs per lane.
constexpr int kWarpMaxPacks = 4;

template <typename T, typename L, int kVec>
bool dispatch_warp(const RowProblem& problem, int* grid, cudaStream_t stream) {
  const int64_t packs = (problem.cols + kVec - 1) / kVec;
  if (packs <= 32) {
    *grid = launch<T, L, kVec, 1, 256, 32>(problem, stream);
  } else if (packs <= 64) {
    *grid = launch<T, L, kVec, 2, 256, 32>(problem, stream);
  } else if (packs <= 32 * kWarpMaxPacks) {
    *grid = launch<T, L, kVec, kWarpMaxPacks, 256, 32>(problem, stream);
  } else {
    return false;
  }
  return true;
}

// block_row (vectorized only): (threads, packs per thread) from short to long rows. 8 packs of 16 bytes are 32
// registers of row data; 512 threads x 8 packs covers a 32000-class float16 row with two blocks per SM.
constexpr int kBlockMaxPacks = 8, kBlockMaxThreads = 1024;

template <typename T, typename L>
bool dispatch_block(const RowProblem& problem, int* grid, cudaStream_t stream) {
  constexpr int kVec = kPackSize<T>;
  const int64_t packs = problem.cols / kVec;
  if (packs <= 256 * 2) {
    *grid = launch<T, L, kVec, 2, 256, 256>(problem, stream);
  } else if (packs <= 256 * 4) {
    *grid = launch<T, L, kVec, 4, 256, 256>(problem, stream);
  } else if (packs <= 512 * 4) {
    *grid = launch<T, L, kVec, 4, 512, 512>(problem, stream);
  } else if (packs <= 512 * 8) {
    *grid = launch<T, L, kVec, 8, 512, 512>(problem, stream);
  } else if (packs <= kBlockMaxThreads * kBlockMaxPacks) {
    *grid = launch<T, L, kVec, kBlockMaxPacks, kBlockMaxThreads, kBlockMaxThreads>(problem, stream);
  } else {
    return false;
  }
  return true;
}

}  // namespace

int64_t warp_row_capacity(DType dtype, bool vectorized) {
  return static_cast<int64_t>(32) * kWarpMaxPacks * (vectorized ? 16 / static_cast<int64_t>(dtype_size(dtype)) : 1);
}

int64_t block_row_capacity(DType dtype, bool vectorized) {
  if (!vectorized) return 0;
  return static_cast<int64_t>(kBlockMaxThreads) * kBlockMaxPacks * (16 / static_cast<int64_t>(dtype_size(dtype)));
}

bool launch_warp_row(const RowProblem& problem, DType dtype, DType label_dtype, bool vectorized, int* grid,
                     cudaStream_t stream) {
  bool launched = false;
  GE2_DISPATCH_FLOATING(dtype, "dtype", GE2_DISPATCH_INDEX(label_dtype, "labels", {
    launched = vectorized ? dispatch_warp<scalar_t, index_t, kPackSize<scalar_t>>(problem, grid, stream)
                          : dispatch_warp<scalar_t, index_t, 1>(problem, grid, stream);
  }));
  return launched;
}

bool launch_block_row(const RowProblem& problem, DType dtype, DType label_dtype, bool vectorized, int* grid,
                      cudaStream_t stream) {
  if (!vectorized) return false;
  bool launched = false;
  GE2_DISPATCH_FLOATING(dtype, "dtype", GE2_DISPATCH_INDEX(label_dtype, "labels", {
    launched = dispatch_block<scalar_t, index_t>(problem, grid, stream);
  }));
  return launched;
}

}  // namespace ge2::cross_entropy
