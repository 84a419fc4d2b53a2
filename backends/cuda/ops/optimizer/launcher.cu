// optimizer launcher: argument checks (the Python layer has checked hyper-parameters for users; these guard the
// native face against null tables and impossible sizes), then the launches.
#include <cmath>
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::optimizer {

std::vector<KernelInfo> kernel_table() {
  return {
      {"multi_tensor", 10,
       "one launch per dtype group over a device chunk table; grad_norm + finalize + step, no host input",
       "float32 params and states; float32/float16/bfloat16 grads; optional float16/bfloat16 parameter copies"},
  };
}

namespace {

void check_group(const GroupTables& group) {
  const int64_t num_chunks = group.num_chunks, chunk_size = group.chunk_size;
  if (num_chunks < 0) throw std::invalid_argument("num_chunks: expected >= 0, got " + std::to_string(num_chunks));
  if (num_chunks > 0 && (group.tensors == nullptr || group.chunks == nullptr)) {
    throw std::invalid_argument("tensors, chunks: null device pointer");
  }
  if (chunk_size <= 0) throw std::invalid_argument("chunk_size: expected > 0, got " + std::to_string(chunk_size));
  if (num_chunks > 0x7fffffff) throw std::invalid_argument("num_chunks: at most 2^31 - 1 chunks per launch");
  if (!is_floating(group.grad_dtype)) {
    throw std::invalid_argument(std::string("grad_dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(group.grad_dtype));
  }
}

}  // namespace

void grad_norm(const NormArgs& args, cudaStream_t stream) {
  check_group(args.group);
  if (args.control == nullptr || (args.group.num_chunks > 0 && args.partials == nullptr)) {
    throw std::invalid_argument("control, partials: null device pointer");
  }
  if (args.group.num_chunks == 0) return;
  launch_grad_norm(args, stream);
}

void finalize(const FinalizeArgs& args, cudaStream_t stream) {
  if (args.control == nullptr) throw std::invalid_argument("control: null device pointer");
  if (args.num_partials > 0 && args.partials == nullptr) throw std::invalid_argument("partials: null device pointer");
  if (args.num_partials < 0) throw std::invalid_argument("num_partials: expected >= 0");
  launch_finalize(args, stream);
}

void step(const StepArgs& args, cudaStream_t stream) {
  check_group(args.group);
  if (args.has_low && args.low_dtype != DType::Float16 && args.low_dtype != DType::BFloat16) {
    throw std::invalid_argument(std::string("low_dtype: expected float16 or bfloat16, got ") +
                                dtype_name(args.low_dtype));
  }
  if (args.control == nullptr) throw std::invalid_argument("control: null device pointer");
  if (args.group.num_chunks == 0) return;
  launch_step(args, stream);
}

void copy_buffers(const CopyEntry* entries, int64_t count, cudaStream_t stream) {
  if (count < 0) throw std::invalid_argument("count: expected >= 0, got " + std::to_string(count));
  if (count > 0 && entries == nullptr) throw std::invalid_argument("entries: null device pointer");
  if (count == 0) return;
  launch_copy_buffers(entries, count, stream);
}

}  // namespace ge2::optimizer
