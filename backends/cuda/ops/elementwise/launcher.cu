// elementwise launcher: names, the broadcast collapse, argument checks and the named kernel's check (vec16: same
// shape; rowcol: 2-d broadcast; strided: anything; the Python selector chooses among them).
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::elementwise {

BinaryOp binary_op_from_name(const std::string& name) {
  if (name == "add") return BinaryOp::Add;
  if (name == "sub") return BinaryOp::Sub;
  if (name == "mul") return BinaryOp::Mul;
  if (name == "div") return BinaryOp::Div;
  throw std::invalid_argument("op: expected one of add, sub, mul, div, got '" + name + "'");
}

UnaryOp unary_op_from_name(const std::string& name) {
  if (name == "relu") return UnaryOp::Relu;
  if (name == "gelu") return UnaryOp::Gelu;
  if (name == "gelu_erf") return UnaryOp::GeluErf;
  if (name == "silu") return UnaryOp::Silu;
  if (name == "sigmoid") return UnaryOp::Sigmoid;
  if (name == "tanh") return UnaryOp::Tanh;
  if (name == "exp") return UnaryOp::Exp;
  if (name == "neg") return UnaryOp::Neg;
  throw std::invalid_argument("op: expected one of relu, gelu, gelu_erf, silu, sigmoid, tanh, exp, neg, got '" +
                              name + "'");
}

Kernel kernel_from_name(const std::string& name) {
  if (name == "vec16") return Kernel::Vec16;
  if (name == "rowcol") return Kernel::RowCol;
  if (name == "strided") return Kernel::Strided;
  throw std::invalid_argument("kernel: expected one of vec16, rowcol, strided, got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::Vec16: return "vec16";
    case Kernel::RowCol: return "rowcol";
    case Kernel::Strided: return "strided";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  return with_dtypes({
      {"vec16", 30, "contiguous operands of one shape, 16-byte vector loads/stores, one pass",
       "binary: a and b of the same shape (after dropping size-1 dims); every pointer 16-byte aligned"},
      {"rowcol", 20, "2-d broadcast: each operand full, a row vector, a column vector or a scalar of [rows, cols]",
       "binary only; the broadcast collapses to at most 2 dims; cols a multiple of 16 bytes; every pointer "
       "16-byte aligned"},
      {"strided", 10, "general broadcast by strided index math (binary); element by element (unary)",
       "none: at most 8 dims after collapsing, which NumPy-style shapes of up to 8 dims always meet",
       kFallback, kAnyAlignment},
  }, floating_dtypes());
}

bool aligned16(const void* pointer) { return is_aligned(pointer, 16); }

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

void check_pointer(const void* pointer, const char* argument) {
  if (pointer == nullptr) throw std::invalid_argument(std::string(argument) + ": null device pointer");
}

void check_floating(DType dtype) {
  if (!is_floating(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") + dtype_name(dtype));
  }
}

bool vec16_fits(const Broadcast& problem) { return problem.same_shape(); }

}  // namespace

bool rowcol_fits(const Broadcast& problem, DType dtype) {
  const int64_t pack = 16 / static_cast<int64_t>(dtype_size(dtype));
  return problem.is_2d() && problem.cols() % pack == 0;
}

Broadcast make_broadcast(const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape) {
  const std::size_t rank = std::max(a_shape.size(), b_shape.size());
  Broadcast result;
  int64_t running_a = 1, running_b = 1;
  int previous_kind = -1;
  // Innermost first, so each operand's stride along a dim it keeps is the product of the kept dims inside it.
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < a_shape.size() ? a_shape[a_shape.size() - 1 - i] : 1;
    const int64_t db = i < b_shape.size() ? b_shape[b_shape.size() - 1 - i] : 1;
    if (da < 0 || db < 0) {
      throw std::invalid_argument("a, b: dims must be >= 0, got shapes " + shape_string(a_shape) + " and " +
                                  shape_string(b_shape));
    }
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("a, b: shapes " + shape_string(a_shape) + " and " + shape_string(b_shape) +
                                  " do not broadcast (axis -" + std::to_string(i + 1) + ": " + std::to_string(da) +
                                  " vs " + std::to_string(db) + ")");
    }
    const int64_t extent = da == 1 ? db : da;
    result.numel *= extent;
    result.numel_a *= da;
    result.numel_b *= db;
    if (extent == 1) continue;
    const bool keeps_a = da == extent, keeps_b = db == extent;
    const int kind = (keeps_a ? 1 : 0) | (keeps_b ? 2 : 0);
    if (kind == previous_kind) {
      result.shape[0] *= extent;  // merged into the current outermost collapsed dim (built at index 0, see below)
    } else {
      if (result.ndim == kMaxDims) {
        throw std::invalid_argument("a, b: shapes " + shape_string(a_shape) + " and " + shape_string(b_shape) +
                                    " collapse to more than " + std::to_string(kMaxDims) + " dims");
      }
      for (int d = result.ndim; d > 0; --d) {  // shift inner dims right; the new dim is outermost so far
        result.shape[d] = result.shape[d - 1];
        result.stride_a[d] = result.stride_a[d - 1];
        result.stride_b[d] = result.stride_b[d - 1];
      }
      ++result.ndim;
      result.shape[0] = extent;
      result.stride_a[0] = keeps_a ? running_a : 0;
      result.stride_b[0] = keeps_b ? running_b : 0;
      previous_kind = kind;
    }
    if (keeps_a) running_a *= extent;
    if (keeps_b) running_b *= extent;
  }
  return result;
}

std::string unsupported_reason(Kernel kernel, const Broadcast& problem, DType dtype) {
  if (!is_floating(dtype)) return std::string("dtype ") + dtype_name(dtype) + " is not a float type";
  switch (kernel) {
    case Kernel::Strided: return "";
    case Kernel::Vec16:
      return vec16_fits(problem) ? "" : "vec16 needs operands of one shape (no broadcasting)";
    case Kernel::RowCol:
      if (!problem.is_2d()) {
        return "rowcol needs a broadcast that collapses to at most 2 dims, got " + std::to_string(problem.ndim);
      }
      return rowcol_fits(problem, dtype) ? ""
                                         : "rowcol needs the last collapsed dim (" + std::to_string(problem.cols()) +
                                               ") to be a multiple of " +
                                               std::to_string(16 / dtype_size(dtype)) + " elements (16 bytes)";
  }
  return "";
}

std::string unsupported_reason(Kernel kernel, int64_t numel, DType dtype) {
  if (!is_floating(dtype)) return std::string("dtype ") + dtype_name(dtype) + " is not a float type";
  if (numel < 0) return "numel must be >= 0";
  if (kernel == Kernel::RowCol) return "rowcol is a broadcast kernel; unary ops have vec16 and strided";
  return "";
}

Kernel binary(BinaryOp op, const void* a, const void* b, void* y, const Broadcast& problem, DType dtype,
              Kernel kernel, cudaStream_t stream) {
  check_floating(dtype);
  if (problem.numel == 0) return kernel;
  check_pointer(a, "a");
  check_pointer(b, "b");
  check_pointer(y, "y");
  const bool aligned = aligned16(a) && aligned16(b) && aligned16(y);
  const std::string reason = unsupported_reason(kernel, problem, dtype);
  if (!reason.empty()) throw std::invalid_argument(std::string("kernel: ") + reason);
  if (kernel != Kernel::Strided && !aligned) {
    throw std::invalid_argument(std::string("a, b, y: kernel ") + kernel_name(kernel) +
                                " needs 16-byte aligned pointers; use kernel 'strided'");
  }
  switch (kernel) {
    case Kernel::Vec16: launch_binary_vec16(op, a, b, y, problem.numel, dtype, stream); break;
    case Kernel::RowCol: launch_binary_rowcol(op, a, b, y, problem, dtype, stream); break;
    default: launch_binary_strided(op, a, b, y, problem, dtype, stream); break;
  }
  return kernel;
}

Kernel unary(UnaryOp op, const void* x, void* y, int64_t numel, DType dtype, Kernel kernel, cudaStream_t stream) {
  check_floating(dtype);
  if (numel < 0) throw std::invalid_argument("numel: expected >= 0, got " + std::to_string(numel));
  const std::string reason = unsupported_reason(kernel, numel, dtype);
  if (!reason.empty()) throw std::invalid_argument(std::string("kernel: ") + reason);
  if (numel == 0) return kernel;
  check_pointer(x, "x");
  check_pointer(y, "y");
  const bool aligned = aligned16(x) && aligned16(y);
  if (kernel == Kernel::Vec16 && !aligned) {
    throw std::invalid_argument("x, y: kernel vec16 needs 16-byte aligned pointers; use kernel 'strided'");
  }
  if (kernel == Kernel::Vec16) {
    launch_unary_vec16(op, x, y, numel, dtype, stream);
  } else {
    launch_unary_scalar(op, x, y, numel, dtype, stream);
  }
  return kernel;
}

}  // namespace ge2::elementwise
