// elementwise: binary ops with NumPy broadcasting (add sub mul div), unary ops (relu gelu gelu_erf silu sigmoid
// tanh exp neg) and their backward passes. Float32 math on float32/float16/bfloat16 storage; outputs contiguous.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "tensor_view.hpp"
#include "kernel_info.hpp"

namespace ge2::elementwise {

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Relu, Gelu, GeluErf, Silu, Sigmoid, Tanh, Exp, Neg };
// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { Vec16, RowCol, Strided };

BinaryOp binary_op_from_name(const std::string& name);
UnaryOp unary_op_from_name(const std::string& name);
Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

// Two operand shapes broadcast against each other, with adjacent dims merged where both operands broadcast alike
// and size-1 output dims dropped. The output is contiguous; an operand's stride is 0 along the dims it is
// broadcast over and otherwise its own row-major stride over the dims it keeps.
struct Broadcast {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride_a[kMaxDims] = {};
  int64_t stride_b[kMaxDims] = {};
  int64_t numel = 1;    // of the output
  int64_t numel_a = 1;  // of each operand
  int64_t numel_b = 1;

  bool same_shape() const { return numel_a == numel && numel_b == numel; }
  // At most two dims: every operand is full, a row vector, a column vector or a scalar of a [rows, cols] output.
  bool is_2d() const { return ndim <= 2; }
  int64_t rows() const { return ndim == 2 ? shape[0] : 1; }
  int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
};

// Throws std::invalid_argument naming a and b when the shapes do not broadcast or collapse to more than kMaxDims.
Broadcast make_broadcast(const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_shape);

// Empty when `kernel` can run the problem (assuming 16-byte aligned buffers, as a plan's are), else the reason.
std::string unsupported_reason(Kernel kernel, const Broadcast& problem, DType dtype);
std::string unsupported_reason(Kernel kernel, int64_t numel, DType dtype);

// Forward passes by the named kernel (std::invalid_argument when it cannot run the problem or the pointers given);
// each returns it.
Kernel binary(BinaryOp op, const void* a, const void* b, void* y, const Broadcast& problem, DType dtype,
              Kernel kernel, cudaStream_t stream);
Kernel unary(UnaryOp op, const void* x, void* y, int64_t numel, DType dtype, Kernel kernel, cudaStream_t stream);

// dx = dy * op'(x).
void unary_backward(UnaryOp op, const void* dy, const void* x, void* dx, int64_t numel, DType dtype,
                    cudaStream_t stream);
// da, db (each skipped when nullptr): the gradient of each operand summed over the dims it was broadcast along.
void binary_backward(BinaryOp op, const void* dy, const void* a, const void* b, void* da, void* db,
                     const Broadcast& problem, DType dtype, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// y = x converted to y_dtype (float32, float16, bfloat16, float8_e4m3fn, float8_e5m2; round to nearest even, FP8
// saturating), contiguous, any alignment.
void cast(const void* x, DType x_dtype, void* y, DType y_dtype, int64_t numel, cudaStream_t stream);

// ---- internal: shared by launcher.cu, kernels/*.cu and backward.cu ------------------------------------------
bool aligned16(const void* pointer);
// The rowcol kernel applies: a 2-d broadcast whose rows are filled by 16-byte vectors.
bool rowcol_fits(const Broadcast& problem, DType dtype);

void launch_binary_vec16(BinaryOp op, const void* a, const void* b, void* y, int64_t numel, DType dtype,
                         cudaStream_t stream);
void launch_binary_rowcol(BinaryOp op, const void* a, const void* b, void* y, const Broadcast& problem, DType dtype,
                          cudaStream_t stream);
void launch_binary_strided(BinaryOp op, const void* a, const void* b, void* y, const Broadcast& problem,
                           DType dtype, cudaStream_t stream);
void launch_unary_vec16(UnaryOp op, const void* x, void* y, int64_t numel, DType dtype, cudaStream_t stream);
void launch_unary_scalar(UnaryOp op, const void* x, void* y, int64_t numel, DType dtype, cudaStream_t stream);

}  // namespace ge2::elementwise
