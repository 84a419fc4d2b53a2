// dropout launcher: argument checks, the named kernel's check, and p == 0 as a copy.
#include <cstdint>
#include <string>

#include "api.hpp"
#include "philox.cuh"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::dropout {

std::vector<KernelInfo> kernel_table() {
  return with_dtypes({
      {"vec16", 20, "16-byte loads and stores, one Philox4x32-10 call per 4 elements",
       "offset % 4 == 0; x and y 16-byte aligned"},
      {"scalar", 10, "element by element, one Philox4x32-10 call per 4 elements: the path that always works",
       "none", kFallback, kAnyAlignment},
  }, floating_dtypes());
}

std::string unsupported_reason(Kernel kernel, uint64_t offset, bool aligned) {
  if (kernel != Kernel::Vec16) return "";
  if (offset % 4 != 0) return "offset " + std::to_string(offset) + " is not a multiple of 4";
  if (!aligned) return "x or y is not 16-byte aligned";
  return "";
}

namespace {

void check_args(const Args& args) {
  if (args.count < 0) throw std::invalid_argument("x: expected a count >= 0, got " + std::to_string(args.count));
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  if (!(args.p >= 0.0 && args.p < 1.0)) {  // NaN fails too
    throw std::invalid_argument("p: expected 0 <= p < 1, got " + std::to_string(args.p));
  }
  if (args.count > 0 && args.offset > UINT64_MAX - static_cast<uint64_t>(args.count - 1)) {
    throw std::invalid_argument("offset: offset + element count exceeds 2^64 (the Philox counter space)");
  }
  if (args.count > 0 && (args.x == nullptr || args.y == nullptr)) {
    throw std::invalid_argument("x, y: null device pointer");
  }
}

}  // namespace

Kernel run(const Args& args, Kernel kernel, cudaStream_t stream) {
  check_args(args);
  const bool aligned = is_aligned(args.x, 16) && is_aligned(args.y, 16);
  const std::string reason = unsupported_reason(kernel, args.offset, aligned);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
  if (args.count == 0) return kernel;
  if (args.p == 0.0) {  // identity: every element kept, scale 1
    if (args.x != args.y) {
      GE2_CUDA_CHECK(cudaMemcpyAsync(args.y, args.x, static_cast<std::size_t>(args.count) * dtype_size(args.dtype),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    return kernel;
  }
  const uint64_t threshold = keep_threshold(args.p);
  const float scale = static_cast<float>(1.0 / (1.0 - args.p));
  if (kernel == Kernel::Vec16) {
    launch_vec16(args, threshold, scale, stream);
  } else {
    launch_scalar(args, threshold, scale, stream);
  }
  return kernel;
}

}  // namespace ge2::dropout
