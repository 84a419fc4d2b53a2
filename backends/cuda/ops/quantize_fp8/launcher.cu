// quantize_fp8 launcher: argument checks and the choice between the 8-element vector and the scalar kernel.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "api.hpp"
#include "status.hpp"

namespace ge2::quantize_fp8 {

void launch_quantize(const void* x, DType x_dtype, const float* scale, void* y, DType y_dtype, float* amax,
                     int64_t numel, bool vectorized, cudaStream_t stream);
void launch_quantize_transpose(const ColumnBlock* blocks, int block_count, DType x_dtype, const float* scale, void* y,
                               void* y_t, DType y_dtype, float* amax, void* column_sum, int64_t rows, int64_t cols,
                               Act act, const void* preact, const float* addend, float* sum, DType value_dtype,
                               cudaStream_t stream);
void launch_quantize_transpose_multi(const std::vector<MultiQuantize>& tensors, DType x_dtype, DType y_dtype,
                                     cudaStream_t stream);

std::vector<KernelInfo> kernel_table() {
  return {
      {"cuda", 10,
       "quantize_fp8 in one pass: 8 elements per step (one 16-byte load of 16-bit x; 'vec8') or element-wise "
       "('scalar'), grid-stride; amax reduced per block, written by the last block (no memset before it)",
       "none (vec8 when x is 8 * itemsize-byte aligned and y 8-byte aligned; the tail runs element-wise)", kFallback,
       kAnyAlignment},
      {"transpose", 10,
       "quantize_fp8_transpose: tiles through shared memory, y and its transpose from one read of x (64 x 64 "
       "tiles loaded through a ring of cp.async stages, 8-byte stores of y and 16-byte stores of y_t when the "
       "shape and alignment allow, else 32 x 32 tiles element-wise), amax reduced per block and written by the "
       "last block; the column sum (dbias) as float32 partials per tile from the same read, added up in row order "
       "by the block completing each column strip",
       "x 2-d, in up to 3 column blocks (the 64 x 64 kernel: rows and cols multiples of 64, block widths too, x, "
       "its blocks and preact 16-byte, y 8-byte and y_t 16-byte aligned, act none, gelu or silu, not float32 x with "
       "preact); quantize_fp8_add_transpose: float32 x + addend (the same 64 x 64 kernel, its ring in 64 KB of "
       "dynamic shared memory, with x, addend and sum 16-byte aligned)",
       kFallback, kAnyAlignment},
      {"transpose_multi", 10,
       "quantize_fp8_transpose_multi: up to 64 tensors' cast-transposes a launch, one wave of resident blocks, each a "
       "run of consecutive 64 x 64 tiles (the tensors' tiles numbered one after another), amax per tensor written "
       "by the launch's last block",
       "x 2-d, one dtype for all (8-element vectors for a tensor whose rows and cols are multiples of 64, x 16-byte, "
       "y 8-byte and y_t 16-byte aligned; element-wise otherwise)",
       kFallback, kAnyAlignment},
      {"scale_update", 10,
       "fp8_scale_update: every tensor's state in one launch (up to 64 a launch, addresses passed by value), one "
       "block per state rolls its amax history, max-reduces it and divides",
       "history lengths >= 1", kFallback, kAnyAlignment},
  };
}

namespace {

void check_quantize_args(DType x_dtype, DType y_dtype, const float* scale, const float* amax) {
  if (!is_floating(x_dtype)) {
    throw std::invalid_argument(std::string("x dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(x_dtype));
  }
  if (!is_float8(y_dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float8_e4m3fn or float8_e5m2, got ") +
                                dtype_name(y_dtype));
  }
  if (scale == nullptr) throw std::invalid_argument("scale: null device pointer");
  if (amax == nullptr) throw std::invalid_argument("amax: null device pointer");
}

}  // namespace

const char* forward(const void* x, DType x_dtype, const float* scale, void* y, DType y_dtype, float* amax,
                    int64_t numel, cudaStream_t stream) {
  check_quantize_args(x_dtype, y_dtype, scale, amax);
  if (numel < 0) throw std::invalid_argument("numel: must be >= 0, got " + std::to_string(numel));
  if (numel > 0 && (x == nullptr || y == nullptr)) throw std::invalid_argument("x, y: null device pointer");
  const auto x_address = reinterpret_cast<std::uintptr_t>(x), y_address = reinterpret_cast<std::uintptr_t>(y);
  const bool vectorized = x_address % (8 * dtype_size(x_dtype)) == 0 && y_address % 8 == 0;
  launch_quantize(x, x_dtype, scale, y, y_dtype, amax, numel, vectorized, stream);
  return vectorized ? "vec8" : "scalar";
}

void quantize_transpose(const void* x, DType x_dtype, const float* scale, void* y, void* y_t, DType y_dtype,
                        float* amax, void* column_sum, int64_t rows, int64_t cols, cudaStream_t stream, Act act,
                        const void* preact, const std::vector<ColumnBlock>& more_blocks) {
  check_quantize_args(x_dtype, y_dtype, scale, amax);
  if (rows < 0 || cols < 0) {
    throw std::invalid_argument("rows, cols: must be >= 0, got " + std::to_string(rows) + ", " + std::to_string(cols));
  }
  if (rows * cols > 0 && (x == nullptr || y == nullptr || y_t == nullptr)) {
    throw std::invalid_argument("x, y, y_t: null device pointer");
  }
  if (act == Act::LeakyRelu) throw std::invalid_argument("act: leaky_relu (its slope) is not a quantize prologue");
  if (preact != nullptr && act == Act::None) {
    throw std::invalid_argument("preact: given with act none (the derivative of which activation?)");
  }
  if (more_blocks.size() + 1 > static_cast<std::size_t>(kMaxColumnBlocks)) {
    throw std::invalid_argument("more_blocks: at most " + std::to_string(kMaxColumnBlocks - 1) +
                                " blocks besides x's, got " + std::to_string(more_blocks.size()));
  }
  if (!more_blocks.empty() && preact != nullptr) {
    throw std::invalid_argument("preact: not with column blocks (x's columns come from several arrays)");
  }
  ColumnBlock blocks[kMaxColumnBlocks] = {{x, cols}};
  for (std::size_t b = 0; b < more_blocks.size(); ++b) {
    const ColumnBlock& block = more_blocks[b];
    if (block.cols <= 0 || block.cols >= blocks[0].cols) {
      throw std::invalid_argument("more_blocks[" + std::to_string(b) + "].cols: expected 1 to " +
                                  std::to_string(blocks[0].cols - 1) + " (x's columns left), got " +
                                  std::to_string(block.cols));
    }
    if (rows > 0 && block.data == nullptr) {
      throw std::invalid_argument("more_blocks[" + std::to_string(b) + "]: null device pointer");
    }
    blocks[0].cols -= block.cols;
    blocks[b + 1] = block;
  }
  launch_quantize_transpose(blocks, static_cast<int>(more_blocks.size()) + 1, x_dtype, scale, y, y_t, y_dtype, amax,
                            column_sum, rows, cols, act, preact, nullptr, nullptr, x_dtype, stream);
}

void quantize_add_transpose(const float* x, const float* addend, float* sum, DType value_dtype, const float* scale,
                            void* y, void* y_t, DType y_dtype, float* amax, void* column_sum, int64_t rows,
                            int64_t cols, cudaStream_t stream) {
  if (!is_floating(value_dtype)) {
    throw std::invalid_argument(std::string("value_dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(value_dtype));
  }
  check_quantize_args(DType::Float32, y_dtype, scale, amax);
  if (rows < 0 || cols < 0) {
    throw std::invalid_argument("rows, cols: must be >= 0, got " + std::to_string(rows) + ", " + std::to_string(cols));
  }
  if (rows * cols > 0 && (x == nullptr || addend == nullptr || sum == nullptr || y == nullptr || y_t == nullptr)) {
    throw std::invalid_argument("x, addend, sum, y, y_t: null device pointer");
  }
  const ColumnBlock blocks[1] = {{x, cols}};
  launch_quantize_transpose(blocks, 1, DType::Float32, scale, y, y_t, y_dtype, amax, column_sum, rows, cols, Act::None,
                            nullptr, addend, sum, value_dtype, stream);
}

void quantize_transpose_multi(const std::vector<MultiQuantize>& tensors, DType x_dtype, DType y_dtype,
                              cudaStream_t stream) {
  for (std::size_t index = 0; index < tensors.size(); ++index) {
    const MultiQuantize& q = tensors[index];
    const std::string where = "tensors[" + std::to_string(index) + "]: ";
    try {
      check_quantize_args(x_dtype, y_dtype, q.scale, q.amax);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(where + error.what());
    }
    if (q.rows < 0 || q.cols < 0 || q.rows > INT32_MAX || q.cols > INT32_MAX) {
      throw std::invalid_argument(where + "rows, cols: expected 0 to 2^31 - 1, got " + std::to_string(q.rows) +
                                  ", " + std::to_string(q.cols));
    }
    if (q.rows * q.cols > 0 && (q.x == nullptr || q.y == nullptr || q.y_t == nullptr)) {
      throw std::invalid_argument(where + "x, y, y_t: null device pointer");
    }
  }
  if (tensors.empty()) return;
  launch_quantize_transpose_multi(tensors, x_dtype, y_dtype, stream);
}

}  // namespace ge2::quantize_fp8
