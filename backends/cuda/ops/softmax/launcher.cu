// softmax launcher: argument checks, the kernel table (warp_row: last axis, n <= 1024; block_row: last axis,
// n <= 16384, 8192 backward; block_row_two_pass: last axis, any n; strided: any axis, the path that always works)
// and the named kernel's check (the Python selector chooses among them).
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::softmax {

Kernel kernel_from_name(const std::string& name) {
  if (name == "warp_row") return Kernel::WarpRow;
  if (name == "block_row") return Kernel::BlockRow;
  if (name == "block_row_two_pass") return Kernel::BlockRowTwoPass;
  if (name == "strided") return Kernel::Strided;
  throw std::invalid_argument("kernel: expected one of warp_row, block_row, block_row_two_pass, strided, got '" + name +
                              "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::WarpRow: return "warp_row";
    case Kernel::BlockRow: return "block_row";
    case Kernel::BlockRowTwoPass: return "block_row_two_pass";
    case Kernel::Strided: return "strided";
  }
  return "unknown";
}

bool is_log_from_name(const std::string& op) {
  if (op == "softmax") return false;
  if (op == "log_softmax") return true;
  throw std::invalid_argument("op: expected 'softmax' or 'log_softmax', got '" + op + "'");
}

std::vector<KernelInfo> kernel_table() {
  const std::string vectors =
      "; 16-byte accesses when n % (16 / itemsize) == 0 and every pointer is 16-byte aligned, scalar otherwise";
  return with_dtypes({
      {"warp_row", 30, "a group of lanes (up to a warp) per row, the row held in registers: one read, one write",
       "softmax over the last axis (inner == 1); n <= " + std::to_string(kWarpRowMax) + vectors},
      {"block_row", 20, "one block of 32-512 threads per row, the row held in registers: one read, one write",
       "softmax over the last axis (inner == 1); n <= " + std::to_string(kBlockRowMaxForward) + " forward, <= " +
           std::to_string(kBlockRowMaxBackward) + " backward" + vectors},
      {"block_row_two_pass", 10,
       "one block of 512 threads per row: online max/sum pass, then a write pass (two reads, one write)",
       "softmax over the last axis (inner == 1); any n" + vectors},
      {"strided", 5,
       "any axis without a transpose: tiles of adjacent inner columns, online statistics merged in shared memory, "
       "then a write pass; scalar accesses. The path that always works",
       "none", kFallback, kAnyAlignment},
  }, floating_dtypes());
}

std::string unsupported_reason(Kernel kernel, int64_t n, int64_t inner, bool backward) {
  if (kernel == Kernel::Strided) return "";
  if (inner != 1) {
    return std::string(kernel_name(kernel)) +
           " needs the softmax axis to be the last one (inner == 1), got inner = " + std::to_string(inner);
  }
  const int64_t limit = kernel == Kernel::WarpRow    ? kWarpRowMax
                        : kernel == Kernel::BlockRow ? (backward ? kBlockRowMaxBackward : kBlockRowMaxForward)
                                                     : INT64_MAX;
  if (n > limit) {
    return std::string(kernel_name(kernel)) + " holds a row in registers: needs n <= " + std::to_string(limit) +
           (backward ? " (backward)" : " (forward)") + ", got n = " + std::to_string(n);
  }
  return "";
}

namespace {

void check_sizes(int64_t outer, int64_t n, int64_t inner, DType dtype) {
  if (outer < 0 || n < 0 || inner < 0) {
    throw std::invalid_argument("outer, n, inner: expected sizes >= 0, got " +
                                std::to_string(outer) + ", " + std::to_string(n) + ", " + std::to_string(inner));
  }
  if (!is_floating(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") + dtype_name(dtype));
  }
}

void check_pointer(const void* pointer, const char* name) {
  if (pointer == nullptr) throw std::invalid_argument(std::string(name) + ": null device pointer");
}

void check_kernel(Kernel kernel, int64_t n, int64_t inner, bool backward) {
  const std::string reason = unsupported_reason(kernel, n, inner, backward);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

}  // namespace

Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_sizes(args.outer, args.n, args.inner, args.dtype);
  check_kernel(kernel, args.n, args.inner, false);
  if (args.outer * args.n * args.inner == 0) return kernel;
  check_pointer(args.x, "x");
  check_pointer(args.y, "y");
  switch (kernel) {
    case Kernel::WarpRow: launch_warp_row_forward(args, stream); break;
    case Kernel::BlockRow: launch_block_row_forward(args, stream); break;
    case Kernel::BlockRowTwoPass: launch_block_row_two_pass_forward(args, stream); break;
    case Kernel::Strided: launch_strided_forward(args, stream); break;
  }
  return kernel;
}

Kernel backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_sizes(args.outer, args.n, args.inner, args.dtype);
  check_kernel(kernel, args.n, args.inner, true);
  if (args.outer * args.n * args.inner == 0) return kernel;
  check_pointer(args.y, "y");
  check_pointer(args.dy, "dy");
  check_pointer(args.dx, "dx");
  switch (kernel) {
    case Kernel::WarpRow: launch_warp_row_backward(args, stream); break;
    case Kernel::BlockRow: launch_block_row_backward(args, stream); break;
    case Kernel::BlockRowTwoPass: launch_block_row_two_pass_backward(args, stream); break;
    case Kernel::Strided: launch_strided_backward(args, stream); break;
  }
  return kernel;
}

}  // namespace ge2::softmax
