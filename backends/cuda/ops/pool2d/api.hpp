// 2-D pooling over the spatial axes of a contiguous NCHW or NHWC array, float32 math whatever the storage type.
//   max_pool2d:      y = max over the window (NaN wins), indices = argmax as ih * W + iw (int32, -1 when the window
//                    holds no input element); backward scatters dy to the argmax through a gather over windows
//   avg_pool2d:      y = sum over the window / divisor (the window size, or its part inside the input when
//                    count_include_pad is false); backward gathers dy / divisor of every window holding an element
//   global_avg_pool: y[n, c] = mean over H x W; backward dx = dy / (H * W)
// Windows: output position o starts at o * stride - pad and takes kernel taps dilation apart (dilation: max only).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::pool2d {

enum class Mode { Max, Avg };
enum class Layout { NCHW, NHWC };

Mode mode_from_name(const std::string& name);
Layout layout_from_name(const std::string& name);

// One windowed pooling problem: x is [batch, channels, height, width] (NCHW) or [batch, height, width, channels]
// (NHWC), y the same with out_height x out_width.
struct Window {
  int64_t batch = 0, channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  bool count_include_pad = true;
  Layout layout = Layout::NCHW;
};

struct ForwardArgs {
  Mode mode = Mode::Max;
  const void* x = nullptr;
  void* y = nullptr;
  int32_t* indices = nullptr;  // max only (required there): the argmax of every output, laid out as y
  Window window;
  DType dtype = DType::Float32;
};

struct BackwardArgs {
  Mode mode = Mode::Max;
  const void* dy = nullptr;
  const int32_t* indices = nullptr;  // max only: the forward's indices
  void* dx = nullptr;
  Window window;
  DType dtype = DType::Float32;
};

// global_avg_pool: input [batch, channels, spatial] (NCHW) or [batch, spatial, channels] (NHWC); output
// [batch, channels]. Forward reads x and writes y; backward reads dy and writes dx (input and output swap roles).
struct GlobalArgs {
  const void* input = nullptr;
  void* output = nullptr;
  int64_t batch = 0, channels = 0, spatial = 0;
  Layout layout = Layout::NCHW;
  DType dtype = DType::Float32;
};

// Check the arguments (std::invalid_argument naming the argument) and enqueue; nothing runs for an empty array.
void forward(const ForwardArgs& args, cudaStream_t stream);
void backward(const BackwardArgs& args, cudaStream_t stream);
void global_forward(const GlobalArgs& args, cudaStream_t stream);
void global_backward(const GlobalArgs& args, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: the launchers of kernels/*.cu and backward.cu, arguments already checked -----------------------
void launch_window_forward(const ForwardArgs& args, cudaStream_t stream);
void launch_window_backward(const BackwardArgs& args, cudaStream_t stream);
void launch_global_forward(const GlobalArgs& args, cudaStream_t stream);
void launch_global_backward(const GlobalArgs& args, cudaStream_t stream);

}  // namespace ge2::pool2d
