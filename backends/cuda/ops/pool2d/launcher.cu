// pool2d: argument checks (what would crash or read out of bounds; user-facing validation lives in
// graph_executor_v2.ops.pool2d) and dispatch to the kernels.
#include <stdexcept>
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::pool2d {
namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument(message);
}

void check_pointer(const void* pointer, const char* argument) {
  require(pointer != nullptr, std::string(argument) + ": null device pointer");
}

void check_window(const Window& w, Mode mode) {
  require(w.batch >= 0 && w.channels >= 0 && w.height >= 1 && w.width >= 1,
          "x: expected batch, channels >= 0 and height, width >= 1");
  require(w.out_height >= 1 && w.out_width >= 1, "y: expected out_height, out_width >= 1");
  require(w.kernel_h >= 1 && w.kernel_w >= 1, "kernel_size: expected values >= 1");
  require(w.stride_h >= 1 && w.stride_w >= 1, "stride: expected values >= 1");
  require(w.dilation_h >= 1 && w.dilation_w >= 1, "dilation: expected values >= 1");
  // A window must reach into the input: padding at most half the window span, as PyTorch requires.
  require(w.pad_h >= 0 && w.pad_w >= 0 && 2 * w.pad_h <= w.dilation_h * (w.kernel_h - 1) + 1 &&
              2 * w.pad_w <= w.dilation_w * (w.kernel_w - 1) + 1,
          "padding: expected values in [0, (dilation * (kernel_size - 1) + 1) / 2]");
  require(mode == Mode::Max || (w.dilation_h == 1 && w.dilation_w == 1), "dilation: avg_pool2d takes dilation 1");
  // Every window must start inside the padded input: the divisor and the backward's window ranges assume it.
  require((w.out_height - 1) * w.stride_h < w.height + w.pad_h && (w.out_width - 1) * w.stride_w < w.width + w.pad_w,
          "y: out_height/out_width exceed the output size of this window");
  require(w.height * w.width < (int64_t{1} << 31), "x: height * width must be < 2^31 (int32 argmax indices)");
}

}  // namespace

Mode mode_from_name(const std::string& name) {
  if (name == "max") return Mode::Max;
  if (name == "avg") return Mode::Avg;
  throw std::invalid_argument("mode: expected 'max' or 'avg', got '" + name + "'");
}

Layout layout_from_name(const std::string& name) {
  if (name == "NCHW") return Layout::NCHW;
  if (name == "NHWC") return Layout::NHWC;
  throw std::invalid_argument("layout: expected 'NCHW' or 'NHWC', got '" + name + "'");
}

void forward(const ForwardArgs& args, cudaStream_t stream) {
  check_window(args.window, args.mode);
  require(is_floating(args.dtype), "dtype: expected float32, float16 or bfloat16");
  const Window& w = args.window;
  if (w.batch * w.channels == 0) return;
  check_pointer(args.x, "x");
  check_pointer(args.y, "y");
  if (args.mode == Mode::Max) check_pointer(args.indices, "indices");
  launch_window_forward(args, stream);
}

void backward(const BackwardArgs& args, cudaStream_t stream) {
  check_window(args.window, args.mode);
  require(is_floating(args.dtype), "dtype: expected float32, float16 or bfloat16");
  const Window& w = args.window;
  if (w.batch * w.channels == 0) return;
  check_pointer(args.dy, "dy");
  check_pointer(args.dx, "dx");
  if (args.mode == Mode::Max) check_pointer(args.indices, "indices");
  launch_window_backward(args, stream);
}

namespace {

void check_global(const GlobalArgs& args, const char* input, const char* output) {
  require(args.batch >= 0 && args.channels >= 0 && args.spatial >= 1,
          std::string(input) + ": expected batch, channels >= 0 and at least one spatial element");
  require(is_floating(args.dtype), "dtype: expected float32, float16 or bfloat16");
  if (args.batch * args.channels == 0) return;
  check_pointer(args.input, input);
  check_pointer(args.output, output);
}

}  // namespace

void global_forward(const GlobalArgs& args, cudaStream_t stream) {
  check_global(args, "x", "y");
  if (args.batch * args.channels > 0) launch_global_forward(args, stream);
}

void global_backward(const GlobalArgs& args, cudaStream_t stream) {
  check_global(args, "dy", "dx");
  if (args.batch * args.channels > 0) launch_global_backward(args, stream);
}

std::vector<KernelInfo> kernel_table() {
  return {
      {"window", 10,
       "max/avg pooling: one thread per output (NCHW) or per output and 16-byte channel vector (NHWC); backward "
       "gathers over the windows holding each input (no atomics)",
       "kernel >= 1, stride >= 1, 0 <= padding <= window span / 2, dilation (max only) >= 1, H * W < 2^31",
       kFallback, kAnyAlignment},
      {"global", 10,
       "global_avg_pool: a warp per (n, c) plane (NCHW) or channel-vector lanes x spatial rows per image (NHWC)",
       "any shape with at least one spatial element", kFallback, kAnyAlignment},
  };
}

}  // namespace ge2::pool2d
