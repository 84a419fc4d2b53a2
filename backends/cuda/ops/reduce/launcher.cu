// reduce launcher: argument checks, the simplification of (shape, axes) into a Layout, the kernel table (row_warp:
// Rows, length <= 4096; row_block: Rows; column, column_wave: Columns; generic: any, always works), the named
// kernel's check (the Python selector chooses among them) and how split reductions are planned (their partials live
// in the module's StreamWorkspace).
#include <algorithm>
#include <string>

#include "api.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::reduce {

Reduction reduction_from_name(const std::string& op) {
  if (op == "sum") return Reduction::Sum;
  if (op == "mean") return Reduction::Mean;
  if (op == "max") return Reduction::Max;
  throw std::invalid_argument("op: expected one of sum, mean, max, got '" + op + "'");
}

Kernel kernel_from_name(const std::string& name) {
  if (name == "row_warp") return Kernel::RowWarp;
  if (name == "row_block") return Kernel::RowBlock;
  if (name == "column") return Kernel::Column;
  if (name == "column_wave") return Kernel::ColumnWave;
  if (name == "generic") return Kernel::Generic;
  throw std::invalid_argument("kernel: expected one of row_warp, row_block, column, column_wave, generic, got '" +
                              name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::RowWarp: return "row_warp";
    case Kernel::RowBlock: return "row_block";
    case Kernel::Column: return "column";
    case Kernel::ColumnWave: return "column_wave";
    case Kernel::Generic: return "generic";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  const std::string vectors = "; 16-byte loads when the contiguous run is a multiple of 16 / itemsize and the "
                              "pointers are 16-byte aligned, scalar otherwise";
  return with_dtypes({
      {"row_warp", 30, "a group of lanes (up to a warp) per output, reducing its contiguous run",
       "the reduced axes are the trailing ones after merging (Rows); length <= " + std::to_string(kRowWarpMax) +
           vectors},
      {"row_block", 20,
       "a block of 512 threads per output; few long rows are split over several blocks into float32 partials, "
       "combined in a fixed order by a second kernel",
       "the reduced axes are the trailing ones after merging (Rows)" + vectors},
      {"column", 20,
       "[outer, length, inner] with inner > 1: tiles of adjacent inner columns, lanes along the reduced axis, a "
       "shared-memory tree per column; split into partials when there are few tiles",
       "one run of reduced axes followed by kept axes after merging (Columns)" + vectors},
      {"column_wave", 15,
       "column's kernel launched as about one wave of resident blocks: wide tiles (rows of up to 32 vectors), the "
       "reduced axis split into float32 partials until the blocks fill every SM, each thread's loads of a batch in "
       "flight together (the tail predicated); a second kernel combines the partials in a fixed order",
       "one run of reduced axes followed by kept axes after merging (Columns)" + vectors},
      {"generic", 5, "a warp per output walking the reduced multi-index: any set of axes. The path that always works",
       "none", kFallback, kAnyAlignment},
  }, floating_dtypes());
}

Layout make_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& axes) {
  const int ndim = static_cast<int>(shape.size());
  if (ndim > kMaxDims) {
    throw std::invalid_argument("shape: at most " + std::to_string(kMaxDims) + " dimensions, got " +
                                std::to_string(ndim));
  }
  bool is_reduced[kMaxDims] = {};
  for (int64_t axis : axes) {
    if (axis < 0 || axis >= ndim) {
      throw std::invalid_argument("axes: expected axes in [0, " + std::to_string(ndim) + "), got " +
                                  std::to_string(axis));
    }
    if (is_reduced[axis]) throw std::invalid_argument("axes: axis " + std::to_string(axis) + " is repeated");
    is_reduced[axis] = true;
  }
  Layout layout;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) throw std::invalid_argument("shape: dimensions must be >= 0");
    if (is_reduced[d] && shape[d] == 0) {
      throw std::invalid_argument("axis: cannot reduce over axis " + std::to_string(d) +
                                  " of size 0 (an empty reduction has no value)");
    }
    layout.numel *= shape[d];
    (is_reduced[d] ? layout.count : layout.outputs) *= shape[d];
    if (shape[d] == 1) continue;
    if (layout.ndim > 0 && layout.reduced[layout.ndim - 1] == is_reduced[d]) {
      layout.extent[layout.ndim - 1] *= shape[d];
    } else {
      layout.extent[layout.ndim] = shape[d];
      layout.reduced[layout.ndim] = is_reduced[d];
      ++layout.ndim;
    }
  }
  // Classify the alternating pattern; Rows and Columns get their [outer, length, inner] view.
  const int n = layout.ndim;
  const auto& e = layout.extent;
  const auto& r = layout.reduced;
  using Kind = Layout::Kind;
  if (n == 0) {
    layout.kind = Kind::Rows;  // one element
  } else if (n == 1) {
    layout.kind = Kind::Rows;
    (r[0] ? layout.length : layout.outer) = e[0];
  } else if (n == 2 && !r[0]) {
    layout.kind = Kind::Rows;
    layout.outer = e[0];
    layout.length = e[1];
  } else if (n == 2) {
    layout.kind = Kind::Columns;
    layout.length = e[0];
    layout.inner = e[1];
  } else if (n == 3 && !r[0]) {
    layout.kind = Kind::Columns;
    layout.outer = e[0];
    layout.length = e[1];
    layout.inner = e[2];
  } else {
    layout.kind = Kind::Generic;
  }
  return layout;
}

std::string unsupported_reason(Kernel kernel, const Layout& layout) {
  switch (kernel) {
    case Kernel::RowWarp:
    case Kernel::RowBlock:
      if (layout.kind != Layout::Kind::Rows) {
        return std::string(kernel_name(kernel)) +
               " needs the reduced axes to be the trailing ones (after dropping size-1 axes and merging neighbours)";
      }
      if (kernel == Kernel::RowWarp && layout.length > kRowWarpMax) {
        return "row_warp reduces runs of at most " + std::to_string(kRowWarpMax) + " elements, got " +
               std::to_string(layout.length);
      }
      return "";
    case Kernel::Column:
    case Kernel::ColumnWave:
      if (layout.kind != Layout::Kind::Columns) {
        return std::string(kernel_name(kernel)) +
               " needs the reduced axes to be one run followed by kept axes (after dropping size-1 axes and merging "
               "neighbours)";
      }
      return "";
    case Kernel::Generic: return "";
  }
  return "";
}

// ---- device facts and split plans ------------------------------------------------------------------------------
namespace {

// Partials one split launch may write: bounded so the workspace stays small (about 0.5 MB on an H100). plan_split
// asks for splits only when there are fewer tasks than SMs, so this bound rarely binds there; column_wave's splits
// stop at it.
int64_t max_partials(int sms) { return int64_t{1024} * sms; }

}  // namespace

int sm_count() {
  int device = 0, count = 0;
  GE2_CUDA_CHECK(cudaGetDevice(&device));
  GE2_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));  // cheap: no cache needed
  return count;
}

Split plan_split(int64_t tasks, int64_t outputs, int64_t length, int64_t min_chunk, int align, cudaStream_t stream) {
  const int sms = sm_count();
  if (tasks >= sms) return Split{1, length, nullptr};
  return plan_split_to(tasks, 2 * int64_t{sms}, outputs, length, min_chunk, align, stream);
}

Split plan_split_to(int64_t tasks, int64_t wanted_blocks, int64_t outputs, int64_t length, int64_t min_chunk,
                    int align, cudaStream_t stream) {
  Split split;
  split.chunk = length;
  if (tasks >= wanted_blocks || outputs == 0) return split;
  const int64_t wanted = (wanted_blocks + tasks - 1) / tasks;
  const int64_t splits =
      std::min({wanted, length / std::max<int64_t>(1, min_chunk), max_partials(sm_count()) / outputs});
  if (splits <= 1) return split;
  const int64_t chunk = ((length + splits - 1) / splits + align - 1) / align * align;
  if ((length + chunk - 1) / chunk <= 1) return split;
  split.splits = (length + chunk - 1) / chunk;
  split.chunk = chunk;
  split.partials = static_cast<float*>(
      StreamWorkspace::get(static_cast<std::size_t>(split.splits * outputs) * sizeof(float), stream));
  return split;
}

// ---- forward -----------------------------------------------------------------------------------------------------
namespace {

void check_kernel(Kernel kernel, const Layout& layout) {
  const std::string reason = unsupported_reason(kernel, layout);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

}  // namespace

Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream) {
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  check_kernel(kernel, args.layout);
  if (args.layout.outputs == 0) return kernel;
  if (args.x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (args.y == nullptr) throw std::invalid_argument("y: null device pointer");
  switch (kernel) {
    case Kernel::RowWarp: launch_row_warp(args, stream); break;
    case Kernel::RowBlock: launch_row_block(args, stream); break;
    case Kernel::Column: launch_column(args, stream); break;
    case Kernel::ColumnWave: launch_column_wave(args, stream); break;
    case Kernel::Generic: launch_generic(args, stream); break;
  }
  return kernel;
}

}  // namespace ge2::reduce
