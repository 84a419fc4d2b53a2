// Device scratch owned by an op module: one buffer per (device, stream), grown on demand and kept for the life of
// the process, like the cuBLASLt workspace, so steady-state calls allocate nothing. Stream order keeps the users of
// one buffer apart.
//
// Capture safety: a CUDA graph captured earlier holds the address of the buffer it was captured with and may be
// replayed at any time, so a buffer is never freed. When a larger one is needed, the old one is retired (kept
// allocated, never handed out again) and the new one is at least twice as large: retired memory stays below the
// size of the live buffer. Growing is refused during capture: run the op once on the stream first (the executor
// warms every plan up before it captures).
//
// get_zeroed hands out a second buffer per (device, stream) that is zero whenever no kernel is using it: every user
// restores the zeros it changed before its kernel ends (grid-completion counters that the last block resets), so a
// kernel that finishes a grid-wide reduction itself needs no memset node before it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "status.hpp"

namespace ge2 {

class StreamWorkspace {
 public:
  // At least `bytes` of 256-byte aligned device memory for work enqueued on `stream`; fresh memory is zero-filled
  // (in stream order).
  static void* get(std::size_t bytes, cudaStream_t stream) {
    static auto* workspaces = new StreamWorkspace();  // never destroyed: outlives Python's teardown order
    return workspaces->acquire(bytes, stream);
  }

  // At least `bytes` of device memory that is zero at the start of every kernel enqueued on `stream` after this
  // call, provided each user leaves it zero when its kernel ends (see the top of this file).
  static void* get_zeroed(std::size_t bytes, cudaStream_t stream) {
    static auto* workspaces = new StreamWorkspace();  // apart from get's: scratch data would break the zeros
    return workspaces->acquire(bytes, stream);
  }

 private:
  struct Buffer {
    void* pointer = nullptr;
    std::size_t bytes = 0;
  };

  void* acquire(std::size_t bytes, cudaStream_t stream) {
    int device = 0;
    check_cuda(cudaGetDevice(&device), GE2_OP_NAME, "cudaGetDevice");
    std::lock_guard<std::mutex> lock(mutex_);
    Buffer& buffer = buffers_[{device, reinterpret_cast<std::uintptr_t>(stream)}];
    if (buffer.bytes >= bytes && buffer.pointer != nullptr) return buffer.pointer;
    if (stream_capturing(stream)) {
      throw std::runtime_error(std::string("ge2 op '") + GE2_OP_NAME + "': its workspace must grow to " +
                               std::to_string(bytes) + " bytes, which cannot happen during CUDA graph capture; "
                               "run the op once on this stream before capturing");
    }
    constexpr std::size_t kGranule = 1u << 16;  // round up so that slowly growing problems do not reallocate often
    const std::size_t wanted = std::max({kGranule, 2 * buffer.bytes, bytes});
    const std::size_t grown = (wanted + kGranule - 1) / kGranule * kGranule;
    void* pointer = nullptr;
    check_cuda(cudaMalloc(&pointer, grown), GE2_OP_NAME, "cudaMalloc(workspace)");
    check_cuda(cudaMemsetAsync(pointer, 0, grown, stream), GE2_OP_NAME, "cudaMemsetAsync(workspace)");
    if (buffer.pointer != nullptr) retired_.push_back(buffer.pointer);
    buffer = Buffer{pointer, grown};
    return pointer;
  }

  std::mutex mutex_;
  std::map<std::pair<int, std::uintptr_t>, Buffer> buffers_;
  std::vector<void*> retired_;  // outgrown buffers: a captured graph may still read or write them
};

}  // namespace ge2
