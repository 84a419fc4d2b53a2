// The row_norm op folder serves two ops, layernorm and rmsnorm: one set of kernels over the last axis, templated on
// kCentered. Centered (layernorm) subtracts the row mean and adds beta; not centered (rmsnorm) divides by the root
// mean square. Statistics are float32 whatever the storage type.
//
// This header is the host side: problem structs, kernel names, argument checks and the launch geometry each kernel
// uses. The kernels are in row_norm_kernels.hpp. CMake builds this folder twice (add_standalone_op(layernorm DIR
// row_norm) and add_standalone_op(rmsnorm DIR row_norm)); launcher.cu and backward.cu instantiate the variant of the
// module being built (kOpCentered), so layernorm and rmsnorm stay independent modules.
//
// Kernels (registry candidates, best first):
//   warp_per_row   one warp per row, the row held in registers (x read once); cols <= 1024 (512 with scalar loads).
//   block_per_row  128..1024 threads per row, the row held in registers; forward cols <= 32768 (8192 with scalar
//                  loads), backward cols <= 8192 (4096): it also holds dy and per-column dgamma/dbeta sums.
//   multipass      one block per row re-reading the row (from L2) for each pass: any cols. Always works.
// The register kernels use 16-byte vector loads when every pointer is 16-byte aligned and cols is a multiple of
// the vector width, and scalar (still coalesced) loads otherwise.
//
// Backward: dx per row, plus dgamma (and dbeta) as column sums over every row, computed deterministically. A
// persistent grid of `parts` blocks each owns a fixed set of rows and writes its column sums to part `blockIdx.x`
// of a float32 workspace [channels][parts][cols]; a second kernel adds the parts in a fixed order. `parts` depends
// on the kernel, the problem and the GPU (its SM count and the kernel's occupancy), never on timing: the result is
// bitwise reproducible on one GPU.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::row_norm {

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { WarpPerRow, BlockPerRow, Multipass };

inline Kernel kernel_from_name(const std::string& name) {
  if (name == "warp_per_row") return Kernel::WarpPerRow;
  if (name == "block_per_row") return Kernel::BlockPerRow;
  if (name == "multipass") return Kernel::Multipass;
  throw std::invalid_argument("kernel: expected one of warp_per_row, block_per_row, multipass, got '" + name + "'");
}

inline const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::WarpPerRow: return "warp_per_row";
    case Kernel::BlockPerRow: return "block_per_row";
    case Kernel::Multipass: return "multipass";
  }
  return "unknown";
}

// Register budget. A thread holds at most kMaxItems elements of a row (of x, and in the backward of dy too, plus
// its column sums) with 16-byte vector loads, kMaxScalarItems with scalar loads, which cost a register per element
// and their own addressing. Groups are at most 1024 threads in the forward (512 with scalar loads) and 256 in the
// backward: wider ones would have to fit in 64 or 128 registers and spill.
constexpr int kMaxItems = 32;
constexpr int kMaxScalarItems = 16;
constexpr int kWidestForwardGroup = 1024;
constexpr int kWidestScalarForwardGroup = 512;
constexpr int kWidestBackwardGroup = 256;
constexpr int kMultipassThreads = 512;

// Forward: y = (x - mean) * rstd * gamma + beta (centered) or y = x * rstd * gamma (not centered), with
// rstd = 1 / sqrt(var + eps) (var = mean((x - mean)^2)) or 1 / sqrt(mean(x^2) + eps). mean/rstd are optional
// float32 outputs, one per row (mean only when centered).
struct Forward {
  const void* x = nullptr;
  const void* gamma = nullptr;
  const void* beta = nullptr;  // centered only
  void* y = nullptr;
  float* mean = nullptr;  // nullptr: not saved
  float* rstd = nullptr;  // nullptr: not saved
  int64_t rows = 0, cols = 0;
  DType dtype = DType::Float32;
  float eps = 1e-5f;
};

// Backward: dx, dgamma, dbeta (centered only). Saved statistics are used when given (rstd, and mean when
// centered), else recomputed from x with eps. `workspace` holds backward_workspace_bytes() bytes of float32.
struct Backward {
  const void* dy = nullptr;
  const void* x = nullptr;
  const void* gamma = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  void* dx = nullptr;
  void* dgamma = nullptr;
  void* dbeta = nullptr;  // centered only
  float* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int64_t rows = 0, cols = 0;
  DType dtype = DType::Float32;
  float eps = 1e-5f;
};

// How a register kernel lays a row out: `group_threads` threads own one row, `groups` rows per block, each thread
// holding `items` elements in packs of `vec` (16 bytes, or 1 for scalar loads).
struct Geometry {
  Kernel kernel = Kernel::Multipass;
  int vec = 1;
  int group_threads = kMultipassThreads;
  int groups = 1;
  int items = 0;  // 0 for multipass: nothing held in registers
  int threads() const { return group_threads * groups; }
};

// Elements per access: 16 bytes when every pointer is 16-byte aligned (`aligned`) and rows start 16-byte aligned
// too (cols a multiple of the width), one element otherwise.
inline int vector_width(int64_t cols, DType dtype, bool aligned) {
  const int pack = static_cast<int>(16 / dtype_size(dtype));
  return aligned && cols % pack == 0 ? pack : 1;
}

inline int max_items(bool vectorized) { return vectorized ? kMaxItems : kMaxScalarItems; }

inline int widest_group(bool backward, bool vectorized) {
  if (backward) return kWidestBackwardGroup;
  return vectorized ? kWidestForwardGroup : kWidestScalarForwardGroup;
}

// The longest row `kernel` holds: warp_per_row 1024 (512 with scalar loads); block_per_row forward 32768 (8192),
// backward 8192 (4096).
inline int64_t max_cols(Kernel kernel, bool backward, bool vectorized) {
  switch (kernel) {
    case Kernel::WarpPerRow: return int64_t{32} * max_items(vectorized);
    case Kernel::BlockPerRow: return int64_t{widest_group(backward, vectorized)} * max_items(vectorized);
    default: return INT64_MAX;
  }
}

// Empty when `kernel` can run rows of `cols` elements; otherwise the reason it cannot.
inline std::string unsupported_reason(Kernel kernel, int64_t cols, DType dtype, bool aligned, bool backward) {
  const bool vectorized = vector_width(cols, dtype, aligned) > 1;
  const int64_t limit = max_cols(kernel, backward, vectorized);
  if (cols <= limit) return "";
  return std::string(kernel_name(kernel)) + " holds a row in registers: needs cols <= " + std::to_string(limit) +
         " (" + (backward ? "backward" : "forward") + (vectorized ? "" : ", scalar loads") + "), got " +
         std::to_string(cols);
}

// Throws std::invalid_argument naming why `kernel` cannot run rows of `cols` elements.
inline void check_kernel(Kernel kernel, int64_t cols, DType dtype, bool aligned, bool backward) {
  const std::string reason = unsupported_reason(kernel, cols, dtype, aligned, backward);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

inline int next_power_of_two(int64_t value) {
  int result = 1;
  while (result < value) result *= 2;
  return result;
}

// The geometry a kernel that supports the problem runs with.
inline Geometry choose_geometry(Kernel kernel, int64_t cols, DType dtype, bool aligned, bool backward) {
  Geometry geometry;
  geometry.kernel = kernel;
  if (kernel == Kernel::Multipass) return geometry;
  geometry.vec = vector_width(cols, dtype, aligned);
  if (kernel == Kernel::WarpPerRow) {
    geometry.group_threads = 32;
    geometry.groups = 4;
  } else {
    // The narrowest group that holds the row.
    const bool vectorized = geometry.vec > 1;
    geometry.group_threads = 128;
    while (geometry.group_threads < widest_group(backward, vectorized) &&
           int64_t{geometry.group_threads} * max_items(vectorized) < cols) {
      geometry.group_threads *= 2;
    }
  }
  const int64_t per_thread = (cols + geometry.group_threads - 1) / geometry.group_threads;
  geometry.items = std::max({next_power_of_two(per_thread), 4, geometry.vec});
  return geometry;
}

// Checks shared by both ops, before anything is launched (std::invalid_argument names the argument).
inline void check_problem(int64_t rows, int64_t cols, DType dtype) {
  if (rows < 0) throw std::invalid_argument("rows: expected >= 0, got " + std::to_string(rows));
  if (cols < 1) throw std::invalid_argument("cols: expected >= 1 (the normalized axis), got " + std::to_string(cols));
  if (!is_floating(dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") + dtype_name(dtype));
  }
}

inline void check_eps(float eps) {
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    throw std::invalid_argument("eps: expected a finite value > 0, got " + std::to_string(eps));
  }
}

inline void require_pointer(const void* pointer, const char* argument) {
  if (pointer == nullptr) throw std::invalid_argument(std::string(argument) + ": null device pointer");
}

inline bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }


inline std::vector<KernelInfo> kernel_table() {
  const std::string vector_rule =
      "16-byte vector loads when x, y (dy, dx), gamma, beta are 16-byte aligned and cols % (16 / itemsize) == 0, "
      "scalar loads otherwise";
  return with_dtypes({
      {"warp_per_row", 30, "one warp per row, the row held in registers: x read once",
       "cols <= " + std::to_string(max_cols(Kernel::WarpPerRow, false, true)) + " (" +
           std::to_string(max_cols(Kernel::WarpPerRow, false, false)) + " with scalar loads); " + vector_rule},
      {"block_per_row", 20, "128-1024 threads per row, the row held in registers: x read once",
       "forward cols <= " + std::to_string(max_cols(Kernel::BlockPerRow, false, true)) + " (" +
           std::to_string(max_cols(Kernel::BlockPerRow, false, false)) + " with scalar loads), backward cols <= " +
           std::to_string(max_cols(Kernel::BlockPerRow, true, true)) + " (" +
           std::to_string(max_cols(Kernel::BlockPerRow, true, false)) + "); " + vector_rule},
      {"multipass", 10, "one block per row re-reading the row for each pass (from L2): the path that always works",
       "none", kFallback, kAnyAlignment},
  }, floating_dtypes());
}

// ---- defined in row_norm_kernels.hpp, instantiated by each op module -----------------------------------------

// Checks the arguments (std::invalid_argument naming the argument, or why `kernel` cannot run the problem), runs
// `kernel` and returns it. Nothing is launched for zero rows (the backward then zeroes dgamma
// and dbeta).
template <bool kCentered>
Kernel forward(const Forward& args, Kernel kernel, cudaStream_t stream);
template <bool kCentered>
Kernel backward(const Backward& args, Kernel kernel, cudaStream_t stream);

// Workspace bytes the backward needs on the current device (0 for zero rows). `aligned`: dy, x, gamma and dx are
// 16-byte aligned (buffers of a plan always are).
template <bool kCentered>
std::size_t backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype, bool aligned, Kernel kernel);

#ifdef GE2_OP_NAME
// The variant of the module being built: add_standalone_op defines GE2_OP_NAME as "layernorm" or "rmsnorm".
inline constexpr bool kOpCentered = std::string_view(GE2_OP_NAME) == "layernorm";
#endif

// Instantiated explicitly, forward in launcher.cu and backward in backward.cu for the module's variant: no other
// translation unit compiles the kernels again.
extern template Kernel forward<true>(const Forward&, Kernel, cudaStream_t);
extern template Kernel forward<false>(const Forward&, Kernel, cudaStream_t);
extern template Kernel backward<true>(const Backward&, Kernel, cudaStream_t);
extern template Kernel backward<false>(const Backward&, Kernel, cudaStream_t);
extern template std::size_t backward_workspace_bytes<true>(int64_t, int64_t, DType, bool, Kernel);
extern template std::size_t backward_workspace_bytes<false>(int64_t, int64_t, DType, bool, Kernel);

}  // namespace ge2::row_norm
