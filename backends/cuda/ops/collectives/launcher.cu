// NCCL communicators and collectives; argument checks throw std::invalid_argument, NCCL failures
// std::runtime_error naming the op, the call and NCCL's own message.
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include <nccl.h>

#include "api.hpp"
#include "status.hpp"

namespace ge2::collectives {
namespace {

struct Communicator {
  ncclComm_t comm = nullptr;
  int rank = 0, world = 0, device = 0;
};

std::mutex registry_mutex;
std::unordered_map<int64_t, Communicator> registry;
int64_t next_handle = 1;

[[noreturn]] void fail(const std::string& what, ncclResult_t status, ncclComm_t comm) {
  std::string message = std::string("ge2 op 'collectives': ") + what + " failed: " + ncclGetErrorString(status);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') message += std::string(" (") + detail + ")";
  throw std::runtime_error(message);
}

// Waits until a non-blocking NCCL call on `comm` has finished, or aborts the communicator after `timeout_s`.
void wait_for(ncclComm_t comm, ncclResult_t status, const std::string& what, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (status == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw std::runtime_error("ge2 op 'collectives': " + what + " did not complete within " +
                               std::to_string(timeout_s) + " s (a peer rank is missing or failed); the communicator "
                               "was aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclResult_t async_status = ncclSuccess;
    ncclCommGetAsyncError(comm, &async_status);
    status = async_status;
  }
  if (status != ncclSuccess) fail(what, status, comm);
}

Communicator lookup(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto found = registry.find(handle);
  if (found == registry.end()) {
    throw std::invalid_argument("communicator: no live communicator has handle " + std::to_string(handle) +
                                " (destroyed, aborted or never created)");
  }
  return found->second;
}

Communicator take(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto found = registry.find(handle);
  if (found == registry.end()) {
    throw std::invalid_argument("communicator: no live communicator has handle " + std::to_string(handle));
  }
  Communicator communicator = found->second;
  registry.erase(found);
  return communicator;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::UInt8: return ncclUint8;
    case DType::Float8E4M3:
    case DType::Float8E5M2:
    case DType::Bool: break;  // FP8 storage and masks are not reduced across ranks
  }
  throw std::invalid_argument("dtype: not supported by NCCL collectives");
}

ncclRedOp_t nccl_op(Reduction reduction) {
  switch (reduction) {
    case Reduction::Sum: return ncclSum;
    case Reduction::Average: return ncclAvg;
    case Reduction::Max: return ncclMax;
  }
  return ncclSum;
}

void check_buffers(const void* send, void* recv, int64_t count) {
  if (count < 0) throw std::invalid_argument("count: expected >= 0, got " + std::to_string(count));
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    throw std::invalid_argument(std::string(send == nullptr ? "send" : "recv") + ": null device pointer");
  }
}

}  // namespace

Reduction reduction_from_name(const std::string& name) {
  if (name == "sum") return Reduction::Sum;
  if (name == "avg") return Reduction::Average;
  if (name == "max") return Reduction::Max;
  throw std::invalid_argument("reduction: expected 'sum', 'avg' or 'max', got '" + name + "'");
}

std::string unique_id() {
  ncclUniqueId id;
  const ncclResult_t status = ncclGetUniqueId(&id);
  if (status != ncclSuccess) fail("ncclGetUniqueId", status, nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

int64_t create(const std::string& id, int world, int rank, int device, double timeout_s) {
  ncclUniqueId unique;
  if (id.size() != sizeof(unique.internal)) {
    throw std::invalid_argument("id: expected " + std::to_string(sizeof(unique.internal)) + " bytes from unique_id(), got " +
                                std::to_string(id.size()));
  }
  if (world < 1) throw std::invalid_argument("world: expected >= 1, got " + std::to_string(world));
  if (rank < 0 || rank >= world) {
    throw std::invalid_argument("rank: expected an int in [0, " + std::to_string(world) + "), got " +
                                std::to_string(rank));
  }
  if (timeout_s <= 0) throw std::invalid_argument("timeout_s: expected > 0");
  std::copy(id.begin(), id.end(), unique.internal);
  GE2_CUDA_CHECK(cudaSetDevice(device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is ours, bounded by the timeout
  Communicator communicator;
  communicator.rank = rank;
  communicator.world = world;
  communicator.device = device;
  const ncclResult_t status = ncclCommInitRankConfig(&communicator.comm, world, unique, rank, &config);
  if (status != ncclSuccess && status != ncclInProgress) fail("ncclCommInitRankConfig", status, nullptr);
  wait_for(communicator.comm, status, "joining the communicator of " + std::to_string(world) + " ranks", timeout_s);
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[next_handle] = communicator;
  return next_handle++;
}

void all_reduce(int64_t handle, const void* send, void* recv, int64_t count, DType dtype, Reduction reduction,
                cudaStream_t stream, double timeout_s) {
  const Communicator communicator = lookup(handle);
  check_buffers(send, recv, count);
  if (count == 0) return;
  const ncclResult_t status = ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_type(dtype),
                                            nccl_op(reduction), communicator.comm, stream);
  wait_for(communicator.comm, status, "ncclAllReduce", timeout_s);
}

void all_reduce_group(int64_t handle, const std::vector<Buffer>& buffers, Reduction reduction, cudaStream_t stream,
                      double timeout_s) {
  const Communicator communicator = lookup(handle);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    try {
      check_buffers(buffers[i].send, buffers[i].recv, buffers[i].count);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument("buffers[" + std::to_string(i) + "]." + error.what());
    }
  }
  ncclResult_t status = ncclGroupStart();
  if (status != ncclSuccess) fail("ncclGroupStart", status, communicator.comm);
  for (const Buffer& buffer : buffers) {
    if (buffer.count == 0) continue;
    status = ncclAllReduce(buffer.send, buffer.recv, static_cast<size_t>(buffer.count), nccl_type(buffer.dtype),
                           nccl_op(reduction), communicator.comm, stream);
    if (status != ncclSuccess && status != ncclInProgress) {
      ncclGroupEnd();
      fail("ncclAllReduce", status, communicator.comm);
    }
  }
  wait_for(communicator.comm, ncclGroupEnd(), "ncclGroupEnd (a bucket of " + std::to_string(buffers.size()) +
                                                 " all-reduces)", timeout_s);
}

void broadcast(int64_t handle, const void* send, void* recv, int64_t count, DType dtype, int root, cudaStream_t stream,
               double timeout_s) {
  const Communicator communicator = lookup(handle);
  check_buffers(send, recv, count);
  if (root < 0 || root >= communicator.world) {
    throw std::invalid_argument("root: expected a rank in [0, " + std::to_string(communicator.world) + "), got " +
                                std::to_string(root));
  }
  if (count == 0) return;
  const ncclResult_t status = ncclBroadcast(send, recv, static_cast<size_t>(count), nccl_type(dtype), root,
                                            communicator.comm, stream);
  wait_for(communicator.comm, status, "ncclBroadcast", timeout_s);
}

std::string async_error(int64_t handle) {
  const Communicator communicator = lookup(handle);
  ncclResult_t status = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(communicator.comm, &status);
  if (queried != ncclSuccess) return ncclGetErrorString(queried);
  if (status == ncclSuccess || status == ncclInProgress) return "";
  std::string message = ncclGetErrorString(status);
  const char* detail = ncclGetLastError(communicator.comm);
  if (detail != nullptr && *detail != '\0') message += std::string(" (") + detail + ")";
  return message;
}

void abort(int64_t handle) {
  const Communicator communicator = take(handle);
  ncclCommAbort(communicator.comm);
}

void destroy(int64_t handle) {
  const Communicator communicator = take(handle);
  ncclResult_t status = ncclCommFinalize(communicator.comm);
  if (status == ncclInProgress) {
    // Finalizing waits for the communicator's outstanding work; a bounded wait keeps a dead peer from hanging us.
    wait_for(communicator.comm, status, "ncclCommFinalize", 60.0);
    status = ncclSuccess;
  }
  if (status != ncclSuccess) fail("ncclCommFinalize", status, communicator.comm);
  status = ncclCommDestroy(communicator.comm);
  if (status != ncclSuccess) fail("ncclCommDestroy", status, nullptr);
}

std::string nccl_version() {
  int version = 0;
  ncclGetVersion(&version);
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

std::vector<KernelInfo> kernel_table() {
  return {
      {"nccl", 10, "NCCL all-reduce / broadcast on the communicator's ranks, enqueued on the stream",
       "a communicator from ge2.distributed.init(); float32/float16/bfloat16/int32/int64/uint8"},
  };
}

}  // namespace ge2::collectives
