// swiglu launcher: argument checks and the named kernel (vec16 or scalar; GE2's selector chooses).
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::swiglu {

Kernel kernel_from_name(const std::string& name) {
  if (name == "vec16") return Kernel::Vec16;
  if (name == "scalar") return Kernel::Scalar;
  throw std::invalid_argument("kernel: expected one of vec16, scalar, got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::Vec16: return "vec16";
    case Kernel::Scalar: return "scalar";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  return with_dtypes({
      {"vec16", 20, "16-byte loads and stores, one pack per thread, grid-stride loop",
       "arrays 16-byte aligned; element count a multiple of 4 (float32) or 8 (float16, bfloat16)"},
      {"scalar", 10, "one element per thread, grid-stride loop: the path that always works", "none", kFallback,
       kAnyAlignment},
  }, floating_dtypes());
}

std::string unsupported_reason(Kernel kernel, int64_t count, DType dtype, bool aligned) {
  if (kernel != Kernel::Vec16) return "";
  const int64_t pack = 16 / static_cast<int64_t>(dtype_size(dtype));
  if (count % pack != 0) {
    return "element count " + std::to_string(count) + " is not a multiple of " + std::to_string(pack) +
           " (16-byte packs of " + dtype_name(dtype) + ")";
  }
  if (!aligned) return "an array is not 16-byte aligned";
  return "";
}

namespace {

void check_common(int64_t count, DType dtype) {
  if (count < 0) throw std::invalid_argument("count: expected >= 0, got " + std::to_string(count));
  if (!is_floating(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(dtype));
  }
}

void check_pointer(const void* pointer, const char* argument) {
  if (pointer == nullptr) throw std::invalid_argument(std::string(argument) + ": null device pointer");
}

// Throws std::invalid_argument naming why `kernel` cannot run the problem.
void check_kernel(Kernel kernel, int64_t count, DType dtype, bool aligned) {
  const std::string reason = unsupported_reason(kernel, count, dtype, aligned);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

}  // namespace

Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_common(args.count, args.dtype);
  const bool aligned = is_aligned(args.a, 16) && is_aligned(args.b, 16) && is_aligned(args.y, 16);
  check_kernel(kernel, args.count, args.dtype, aligned);
  if (args.count == 0) return kernel;
  check_pointer(args.a, "a");
  check_pointer(args.b, "b");
  check_pointer(args.y, "y");
  if (kernel == Kernel::Vec16) {
    launch_forward_vec16(args, stream);
  } else {
    launch_forward_scalar(args, stream);
  }
  return kernel;
}

Kernel backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_common(args.count, args.dtype);
  // A gradient not asked for (nullptr) is never stored, so its alignment does not matter.
  const bool aligned = is_aligned(args.dy, 16) && is_aligned(args.a, 16) && is_aligned(args.b, 16) &&
                       is_aligned(args.da, 16) && is_aligned(args.db, 16);
  check_kernel(kernel, args.count, args.dtype, aligned);
  if (args.count == 0) return kernel;
  check_pointer(args.dy, "dy");
  check_pointer(args.a, "a");
  check_pointer(args.b, "b");
  if (kernel == Kernel::Vec16) {
    launch_backward_vec16(args, stream);
  } else {
    launch_backward_scalar(args, stream);
  }
  return kernel;
}

}  // namespace ge2::swiglu
