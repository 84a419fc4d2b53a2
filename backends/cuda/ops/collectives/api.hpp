// collectives: NCCL communicators and the collectives data-parallel training needs (all-reduce, broadcast), on
// device buffers and a stream, so they enqueue like kernels and are captured into CUDA graphs with the rest of a
// step. Communicators are created non-blocking and every wait on NCCL is bounded by a timeout: a peer that never
// arrives or dies makes the call raise (and the communicator abort) instead of hanging the process.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::collectives {

enum class Reduction { Sum, Average, Max };

Reduction reduction_from_name(const std::string& name);

// 128 opaque bytes that every rank passes to create() (rank 0 makes it and shares it through a store).
std::string unique_id();

// A communicator of `world` ranks, this process being `rank`, on CUDA device `device`; returns its handle.
// Raises std::runtime_error when the others do not join within `timeout_s` seconds.
int64_t create(const std::string& id, int world, int rank, int device, double timeout_s);

// recv = reduction over ranks of send (send may equal recv), `count` elements of `dtype`, enqueued on `stream`.
void all_reduce(int64_t handle, const void* send, void* recv, int64_t count, DType dtype, Reduction reduction,
                cudaStream_t stream, double timeout_s);

// One bucket: the all-reduces of several buffers (each send[i] -> recv[i], count[i] elements of dtype[i]) issued as
// one NCCL group, so NCCL fuses them into as few launches as it can; no copy into a flat buffer is needed.
struct Buffer {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::Float32;
};
void all_reduce_group(int64_t handle, const std::vector<Buffer>& buffers, Reduction reduction, cudaStream_t stream,
                      double timeout_s);

// recv = root's send on every rank.
void broadcast(int64_t handle, const void* send, void* recv, int64_t count, DType dtype, int root, cudaStream_t stream,
               double timeout_s);

// "" while the communicator is healthy, else NCCL's description of the asynchronous error (a peer failed, ...).
std::string async_error(int64_t handle);

// Aborts the communicator's outstanding work (unblocking every NCCL call of this rank) and frees it.
void abort(int64_t handle);

// Frees a healthy communicator after its work has finished.
void destroy(int64_t handle);

std::string nccl_version();

std::vector<KernelInfo> kernel_table();

}  // namespace ge2::collectives
