// batch_norm: argument checks (what would crash; user-facing validation lives in graph_executor_v2.ops.batch_norm),
// the split of the channel reductions over blocks, the workspace, and dispatch.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"
#include "vector_access.hpp"

namespace ge2::batch_norm {
namespace {

constexpr int kThreads = 256;                 // as channel_kernels.cuh
constexpr int64_t kTargetBlocks = 132 * 4;    // enough blocks in flight for the H100's bandwidth
constexpr int64_t kMinVectorsPerThread = 4;   // below this a split costs more than it brings

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument(message);
}

void check_pointer(const void* pointer, const char* argument) {
  require(pointer != nullptr, std::string(argument) + ": null device pointer");
}

void check_shape(const Shape& shape, const char* argument) {
  require(shape.batch >= 1 && shape.channels >= 1 && shape.spatial >= 1,
          std::string(argument) + ": expected batch, channels and spatial sizes >= 1");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Layout layout_from_name(const std::string& name) {
  if (name == "NCHW") return Layout::NCHW;
  if (name == "NHWC") return Layout::NHWC;
  throw std::invalid_argument("layout: expected 'NCHW' or 'NHWC', got '" + name + "'");
}

Split plan_split(const Shape& shape, DType dtype, bool aligned) {
  Split split;
  const int pack = static_cast<int>(16 / dtype_size(dtype));
  if (shape.layout == Layout::NCHW) {
    split.vector = aligned && shape.spatial % pack == 0 ? pack : 1;
    const int64_t per_channel = shape.count() / split.vector;
    split.splits = std::clamp<int64_t>(ceil_div(kTargetBlocks, shape.channels), 1,
                                       std::max<int64_t>(1, per_channel / (kThreads * kMinVectorsPerThread)));
  } else {
    split.vector = aligned && shape.channels % pack == 0 ? pack : 1;
    const int64_t vectors = shape.channels / split.vector;
    while (split.lanes < 32 && split.lanes < vectors) split.lanes *= 2;
    split.tiles = ceil_div(vectors, split.lanes);
    const int64_t rows_per_block = kThreads / split.lanes;
    split.splits = std::clamp<int64_t>(ceil_div(kTargetBlocks, split.tiles), 1,
                                       std::max<int64_t>(1, shape.count() / (rows_per_block * kMinVectorsPerThread)));
  }
  return split;
}

std::size_t workspace_floats(const Shape& shape, const Split& split) {
  return static_cast<std::size_t>(3 * shape.channels + 3 * split.splits * shape.channels);
}

void forward(const ForwardArgs& args, cudaStream_t stream) {
  check_shape(args.shape, "x");
  require(is_floating(args.dtype), "dtype: expected float32, float16 or bfloat16");
  require(!args.training || args.shape.count() > 1,
          "x: training needs more than one value per channel (batch * spatial > 1)");
  check_pointer(args.x, "x");
  check_pointer(args.gamma, "gamma");
  check_pointer(args.beta, "beta");
  check_pointer(args.running_mean, "running_mean");
  check_pointer(args.running_var, "running_var");
  check_pointer(args.y, "y");
  check_pointer(args.saved_mean, "saved_mean");
  check_pointer(args.saved_invstd, "saved_invstd");
  check_pointer(args.running_mean_out, "running_mean_out");
  check_pointer(args.running_var_out, "running_var_out");
  const Split split = plan_split(args.shape, args.dtype, is_aligned(args.x, 16) && is_aligned(args.y, 16));
  auto* workspace = static_cast<float*>(
      StreamWorkspace::get(workspace_floats(args.shape, split) * sizeof(float), stream));
  launch_forward(args, split, workspace, stream);
}

void backward(const BackwardArgs& args, cudaStream_t stream) {
  check_shape(args.shape, "x");
  require(is_floating(args.dtype), "dtype: expected float32, float16 or bfloat16");
  check_pointer(args.dy, "dy");
  check_pointer(args.x, "x");
  check_pointer(args.gamma, "gamma");
  check_pointer(args.saved_mean, "saved_mean");
  check_pointer(args.saved_invstd, "saved_invstd");
  check_pointer(args.dx, "dx");
  check_pointer(args.dgamma, "dgamma");
  check_pointer(args.dbeta, "dbeta");
  const bool aligned = is_aligned(args.dy, 16) && is_aligned(args.x, 16) && is_aligned(args.dx, 16);
  const Split split = plan_split(args.shape, args.dtype, aligned);
  auto* workspace = static_cast<float*>(
      StreamWorkspace::get(workspace_floats(args.shape, split) * sizeof(float), stream));
  launch_backward(args, split, workspace, stream);
}

std::vector<KernelInfo> kernel_table() {
  return {{"split_welford", 10,
           "training: Welford partials per (split, channel) merged in a fixed order, a per-channel finalize, then "
           "one affine pass walking back through the data (L2 reuse); inference: finalize + affine pass; backward "
           "alike with sums of dy and dy * xhat",
           "x NCHW or NHWC with batch, channels, spatial >= 1; training needs batch * spatial > 1",
           kFallback, kAnyAlignment}};
}

}  // namespace ge2::batch_norm
