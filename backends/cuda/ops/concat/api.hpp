// concat: y = the inputs joined along one axis, and its backward, the split of dy into the inputs' gradients.
// Seen from the axis, every input i is `outer` rows of widths[i] contiguous elements (its extent along the axis
// times the inner extents), and y's rows are the inputs' rows side by side: input i fills the columns
// [column_i, column_i + widths[i]) of rows of sum(widths) elements.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::concat {

// The kernel is chosen by the Python selector (graph_executor_v2/selection.py); a call names it.
enum class Kernel { Fused, Copy2d };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

struct Layout {
  int64_t outer = 0;
  std::vector<int64_t> widths;  // per input, in elements
  DType dtype = DType::Float32;
};

// Empty when `kernel` can run the layout; otherwise the reason it cannot. Throws std::invalid_argument for a
// layout no kernel can run.
std::string unsupported_reason(Kernel kernel, const Layout& layout);

// y <- the inputs side by side (every buffer contiguous) by `kernel`. Returns the kernel that ran.
Kernel forward(const std::vector<const void*>& inputs, void* y, const Layout& layout, Kernel kernel,
               cudaStream_t stream);

// Each grads[i] <- its columns of dy (every buffer contiguous) by `kernel`. Returns the kernel that ran.
Kernel backward(const void* dy, const std::vector<void*>& grads, const Layout& layout, Kernel kernel,
                cudaStream_t stream);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu, kernels/fused.cu and backward.cu ------------------------------------------

// Throws std::invalid_argument for a bad layout or a null buffer that has elements to move; `parts_name` and
// `whole_name` name the buffers in messages ("inputs" and "y", or "grads" and "dy").
void check_buffers(const Layout& layout, const std::vector<const void*>& parts, const void* whole,
                   const char* parts_name, const char* whole_name);

// Throws std::invalid_argument naming why `kernel` cannot run the layout.
void check_kernel(Kernel kernel, const Layout& layout);

// The fused kernel: one launch moves every part (up to kMaxPartsPerLaunch parts; more take more launches).
// `parts` are the inputs (concat) or the gradients (split); `whole` is y or dy.
constexpr int kMaxPartsPerLaunch = 32;
void launch_fused(void* whole, const std::vector<void*>& parts, const Layout& layout, bool split, cudaStream_t stream);

// One cudaMemcpy2DAsync per part (cudaMemcpyAsync when there is a single row).
void launch_copy2d(void* whole, const std::vector<void*>& parts, const Layout& layout, bool split,
                   cudaStream_t stream);

}  // namespace ge2::concat
