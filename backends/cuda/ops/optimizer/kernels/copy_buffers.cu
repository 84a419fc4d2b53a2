// copy_buffers: a training step's buffer updates (batch norm's running statistics, FP8 delayed scaling's amax
// histories and scales) copied from the plan's outputs into the persistent buffers in one launch, instead of one
// memcpy node per buffer in the captured step (a GPT-2 FP8 step has 423 of them, each a few bytes).
// One block per table row, grid-stride over the rows; 16-byte words where both addresses and the size allow,
// 4-byte words next, bytes otherwise.
#include <cstdint>

#include "api.hpp"
#include "status.hpp"

namespace ge2::optimizer {
namespace {

constexpr int kThreads = 128;

template <typename Word>
__device__ void copy_words(const char* __restrict__ source, char* __restrict__ destination, int64_t bytes) {
  const auto* from = reinterpret_cast<const Word*>(source);
  auto* to = reinterpret_cast<Word*>(destination);
  for (int64_t i = threadIdx.x; i < bytes / static_cast<int64_t>(sizeof(Word)); i += kThreads) to[i] = from[i];
}

__global__ void __launch_bounds__(kThreads) copy_buffers_kernel(const CopyEntry* __restrict__ entries,
                                                                 int64_t count) {
  for (int64_t row = blockIdx.x; row < count; row += gridDim.x) {
    const CopyEntry entry = entries[row];
    const auto* source = reinterpret_cast<const char*>(entry.source);
    auto* destination = reinterpret_cast<char*>(entry.destination);
    const uint64_t alignment = entry.source | entry.destination | static_cast<uint64_t>(entry.bytes);
    if (alignment % 16 == 0) {
      copy_words<uint4>(source, destination, entry.bytes);
    } else if (alignment % 4 == 0) {
      copy_words<uint32_t>(source, destination, entry.bytes);
    } else {
      copy_words<unsigned char>(source, destination, entry.bytes);
    }
  }
}

}  // namespace

void launch_copy_buffers(const CopyEntry* entries, int64_t count, cudaStream_t stream) {
  const int blocks = static_cast<int>(count < 1024 ? count : 1024);
  copy_buffers_kernel<<<blocks, kThreads, 0, stream>>>(entries, count);
  GE2_CHECK_LAUNCH("copy_buffers");
}

}  // namespace ge2::optimizer
