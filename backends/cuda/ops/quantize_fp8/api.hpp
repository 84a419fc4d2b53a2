// quantize_fp8: y = FP8(x * scale), saturating, and amax = max |x| in the same pass over x (no separate amax
// kernel); fp8_scale_update: delayed scaling's amax history and scale, on the device. Scales and amaxes are
// float32 device scalars: delayed scaling keeps them on the device, so a captured step never syncs the host.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "activation.hpp"
#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::quantize_fp8 {

// x: float32, float16 or bfloat16; y: float8_e4m3fn or float8_e5m2; both contiguous, `numel` elements. amax is
// set to max |x| (NaN when x holds one: the maximum is over the bits of |x|) by the kernel's last block: it needs no
// zeroing first, and the launch is one kernel node (a memset only for numel 0). Any alignment; 16-byte
// aligned x with 8-byte aligned y take 8-element vectors. Returns the kernel that ran ("vec8" or "scalar").
const char* forward(const void* x, DType x_dtype, const float* scale, void* y, DType y_dtype, float* amax,
                    int64_t numel, cudaStream_t stream);

// The same for a 2-d x [rows, cols], also writing y's transpose y_t [cols, rows] (one read of x for both layouts)
// and, when column_sum is not null, the sum of x over its rows into column_sum [cols] of x's dtype (a linear
// layer's dbias when x is its output gradient): float32 partial sums per row tile from the same read, added up in
// row order by the block that completes each column strip (deterministic; the partials live in the stream's
// workspace). One kernel node, column sum or not.
// An activation prologue quantizes v instead of x, computed in float32 from the same read: v = act(x) when preact is
// null (x is the activation's input), v = x * act'(preact) otherwise (x is the gradient of the activation's output,
// preact [rows, cols] of x's dtype its input). amax and column_sum are then those of v. FP8 training reads GELU's
// output and GELU's input gradient only through this quantize, so neither is written in 16 bits.
// x may come in column blocks, read in place of their concatenation (a QKV projection's three output gradients,
// which FP8 training would otherwise concatenate only for this read): x [rows, cols] is then x's own block
// [rows, cols - the others' columns] followed by each of more_blocks [rows, block.cols] (each contiguous), up to
// kMaxColumnBlocks blocks in all; no preact with blocks.
struct ColumnBlock {
  const void* data;
  int64_t cols;
};
constexpr int kMaxColumnBlocks = 3;
void quantize_transpose(const void* x, DType x_dtype, const float* scale, void* y, void* y_t, DType y_dtype,
                        float* amax, void* column_sum, int64_t rows, int64_t cols, cudaStream_t stream,
                        Act act = Act::None, const void* preact = nullptr,
                        const std::vector<ColumnBlock>& more_blocks = {});

// quantize_transpose of s = x + addend rounded to value_dtype, writing s itself to sum (all three float32 [rows,
// cols], contiguous): a float32 add and a cast to value_dtype (float32, float16 or bfloat16) followed by a quantize,
// bit for bit, in one pass; amax and column_sum (of value_dtype) are those of the rounded values. FP8 training's
// residual-stream gradients: the sum of two layers' float32 input gradients, whose bfloat16 copy only a quantize
// read, are added here, and the 16-bit copy is never written.
void quantize_add_transpose(const float* x, const float* addend, float* sum, DType value_dtype, const float* scale,
                            void* y, void* y_t, DType y_dtype, float* amax, void* column_sum, int64_t rows,
                            int64_t cols, cudaStream_t stream);

// Several 2-d tensors' quantize_transpose (no column sum, no activation, one x dtype and one FP8 dtype) in one launch
// of up to kTensorsPerLaunch tensors: y = FP8(x * scale), y_t its transpose and amax = max |x| per tensor, bit for
// bit what a quantize_transpose per tensor writes. FP8 training quantizes all its weights this way (each alone is too
// little work to fill the GPU). A tensor may be empty (its amax is then 0); any shape and alignment (a tensor whose
// rows and cols are multiples of 64, with x 16-byte, y 8-byte and y_t 16-byte aligned, takes 8-element vectors).
struct MultiQuantize {
  const void* x;
  const float* scale;
  void* y;
  void* y_t;
  float* amax;
  int64_t rows, cols;
};
constexpr int kTensorsPerLaunch = 64;
void quantize_transpose_multi(const std::vector<MultiQuantize>& tensors, DType x_dtype, DType y_dtype,
                              cudaStream_t stream);

// One tensor's delayed-scaling state (float32 device arrays: history [length], scale, amax) and where its update
// goes (new_history [length], new_scale, new_scale_inv).
struct ScaleState {
  const float* history;
  const float* scale;
  const float* amax;
  float* new_history;
  float* new_scale;
  float* new_scale_inv;
  int64_t length;
};

// Delayed scaling, each tensor's state after a step: new_history = [amax, history[0 .. length-2]] (newest first),
// new_scale = fp8_max(dtype) / (max(new_history) * 2^margin), new_scale_inv = 1 / new_scale. An all-zero history
// keeps the previous scale; a non-finite amax (an overflowed step) leaves history and scale as they were. The
// outputs must not alias the inputs (the trainer copies them over the state after the step). Every state in one
// launch of up to kStatesPerLaunch (their addresses passed by value), one block per state: a training step's
// hundreds of FP8 tensors update in a few launches, not one each.
constexpr int kStatesPerLaunch = 64;
void scale_update(const std::vector<ScaleState>& states, DType dtype, int margin, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

}  // namespace ge2::quantize_fp8
