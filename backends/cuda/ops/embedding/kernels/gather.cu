// Candidates vec16 and scalar: a group of lanes per output row (the row's pack count rounded up to a power of two,
// at most a warp, so short rows do not leave most of a warp idle) copies table[id] to out[i], 16-byte packs when
// the row length and pointers allow (vec16), element by element otherwise (scalar, always works). An id outside
// [0, vocab) gives a NaN row and is recorded (index_checks.hpp); nothing is read out of bounds.
#include <algorithm>
#include <cmath>

#include "api.hpp"
#include "index_checks.hpp"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::embedding {
namespace {

constexpr int kThreads = 256;

template <typename T, typename L, int kVec>
__global__ void __launch_bounds__(kThreads) gather_rows(const T* __restrict__ table, const L* __restrict__ ids,
                                                        T* __restrict__ out, int64_t vocab, int64_t dim,
                                                        int64_t count, int lanes, unsigned long long* id_error) {
  const int64_t packs_per_row = dim / kVec;
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (kThreads / lanes);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / lanes; row < count;
       row += groups) {
    const int64_t id = static_cast<int64_t>(ids[row]);
    T* destination = out + row * dim;
    if (id < 0 || id >= vocab) {
      if (lane == 0) record_bad_index(id_error, row);
      Pack<T, kVec> nan_pack;
#pragma unroll
      for (int i = 0; i < kVec; ++i) nan_pack.values[i] = from_float<T>(NAN);
      for (int64_t pack = lane; pack < packs_per_row; pack += lanes) {
        store_pack<T, kVec>(destination + pack * kVec, nan_pack);
      }
      continue;
    }
    const T* source = table + id * dim;
#pragma unroll 4
    for (int64_t pack = lane; pack < packs_per_row; pack += lanes) {
      store_pack<T, kVec>(destination + pack * kVec, load_pack<T, kVec>(source + pack * kVec));
    }
  }
}

template <typename T, typename L, int kVec>
void launch_typed(const ForwardArgs& args, unsigned long long* id_error, cudaStream_t stream) {
  int device = 0, sms = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int lanes = lanes_per_row(args.dim / kVec);
  const int64_t rows_per_block = kThreads / lanes;
  const int blocks = static_cast<int>(
      std::min<int64_t>((args.count + rows_per_block - 1) / rows_per_block, static_cast<int64_t>(sms) * 16));
  gather_rows<T, L, kVec><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(args.table), static_cast<const L*>(args.ids), static_cast<T*>(args.out), args.vocab,
      args.dim, args.count, lanes, id_error);
  GE2_CHECK_LAUNCH("embedding gather_rows");
}

}  // namespace

int lanes_per_row(int64_t packs_per_row) {
  int lanes = 1;
  while (lanes < 32 && lanes < packs_per_row) lanes *= 2;
  return lanes;
}

void launch_gather(const ForwardArgs& args, bool vectorized, unsigned long long* id_error, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(args.dtype, "dtype", GE2_DISPATCH_INDEX(args.id_dtype, "ids", {
    if (vectorized) {
      launch_typed<scalar_t, index_t, kPackSize<scalar_t>>(args, id_error, stream);
    } else {
      launch_typed<scalar_t, index_t, 1>(args, id_error, stream);
    }
  }));
}

}  // namespace ge2::embedding
