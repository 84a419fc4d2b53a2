// reduce: sum, mean and max of a contiguous array over a set of axes, float32 accumulation whatever the storage
// type; y is contiguous in the order of the kept axes (keepdims does not change its bytes).
//   backward: sum  dx = dy broadcast over the reduced axes;  mean  the same divided by the reduced count;
//             max  dy goes to the elements equal to the maximum, split equally among ties (NaN counts as equal
//             to a NaN maximum), 0 elsewhere.
// Max propagates NaN (like NumPy); sum and mean of float32 data accumulate in float32 in a fixed order, so results
// are bitwise reproducible on one GPU. Reducing over an axis of size 0 is rejected.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "tensor_view.hpp"
#include "kernel_info.hpp"

namespace ge2::reduce {

enum class Reduction { Sum, Mean, Max };
Reduction reduction_from_name(const std::string& op);

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { RowWarp, RowBlock, Column, ColumnWave, Generic };
Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

// Rows whose reduced run fits row_warp.
constexpr int64_t kRowWarpMax = 4096;

// The problem in its simplest form: extent-1 dims dropped, neighbouring dims that are both reduced or both kept
// merged into one. What is left alternates kept and reduced dims. Rows: [outer kept, length reduced] (the reduced
// elements of an output are one contiguous run); Columns: [outer kept, length reduced, inner kept] with inner > 1
// (outer may be 1); Generic: anything else, e.g. [reduced, kept, reduced].
struct Layout {
  enum class Kind { Rows, Columns, Generic };
  Kind kind = Kind::Rows;
  int ndim = 0;
  int64_t extent[kMaxDims] = {};
  bool reduced[kMaxDims] = {};
  int64_t outer = 1, length = 1, inner = 1;  // Rows and Columns: the [outer, length, inner] view
  int64_t outputs = 1;                       // elements of y
  int64_t count = 1;                         // elements reduced into each output
  int64_t numel = 1;
};

// Checks the axes (in [0, ndim), no repeats) and that no reduced axis is empty, then simplifies.
Layout make_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& axes);

struct ForwardArgs {
  const void* x = nullptr;
  void* y = nullptr;
  Layout layout;
  DType dtype = DType::Float32;
  Reduction reduction = Reduction::Sum;
};

struct BackwardArgs {
  const void* dy = nullptr;
  const void* x = nullptr;  // max only
  const void* y = nullptr;  // max only: the forward output
  void* dx = nullptr;
  Layout layout;
  DType dtype = DType::Float32;
  Reduction reduction = Reduction::Sum;
};

// Empty when `kernel` can run the layout; otherwise the reason it cannot.
std::string unsupported_reason(Kernel kernel, const Layout& layout);

// Runs `kernel` (std::invalid_argument when it cannot run the problem) and returns it. Nothing is launched
// when y is empty.
Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream);
void backward(const BackwardArgs& args, cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu, kernels/*.cu and backward.cu --------------------------------------------

// How a launch splits each reduction: `splits` > 1 cuts the reduced run of every output into chunks of `chunk`
// elements (a multiple of the vector width) reduced by separate blocks into float32 partials
// [splits][outputs], which finalize_partials then combines in a fixed order. Used when there are too few outputs
// to fill the GPU.
struct Split {
  int64_t splits = 1;
  int64_t chunk = 0;
  float* partials = nullptr;  // per-stream workspace; nullptr when splits == 1
};

// The split for `tasks` independent blocks (one per output row, or per column tile) writing `outputs` values,
// each reducing a run of `length` elements: none when the tasks fill the GPU; else enough splits for about two
// blocks per SM, each chunk at least `min_chunk` elements and a multiple of `align`. The partials live in the
// module's StreamWorkspace (grown on first use, so the first split launch of a size on a stream must not be
// inside CUDA graph capture).
Split plan_split(int64_t tasks, int64_t outputs, int64_t length, int64_t min_chunk, int align, cudaStream_t stream);
// The split that brings `tasks` blocks up to about `wanted_blocks` (a split whenever there are fewer tasks, whatever
// the SM count), with the same chunk and workspace rules as plan_split.
Split plan_split_to(int64_t tasks, int64_t wanted_blocks, int64_t outputs, int64_t length, int64_t min_chunk,
                    int align, cudaStream_t stream);
// The number of SMs of the current device.
int sm_count();

void launch_row_warp(const ForwardArgs& args, cudaStream_t stream);
void launch_row_block(const ForwardArgs& args, cudaStream_t stream);
void launch_column(const ForwardArgs& args, cudaStream_t stream);
void launch_column_wave(const ForwardArgs& args, cudaStream_t stream);
void launch_generic(const ForwardArgs& args, cudaStream_t stream);
// y[o] = combine over s of partials[s * outputs + o], scaled and stored as the dtype.
void launch_finalize_partials(const float* partials, void* y, int64_t outputs, int64_t splits, DType dtype,
                              Reduction reduction, float scale, cudaStream_t stream);

}  // namespace ge2::reduce
