// concat launcher: layout checks, the named kernel's check, and the forward (backward.cu has the split).
#include <string>

#include "api.hpp"
#include "status.hpp"

namespace ge2::concat {

Kernel kernel_from_name(const std::string& name) {
  if (name == "fused") return Kernel::Fused;
  if (name == "copy2d") return Kernel::Copy2d;
  throw std::invalid_argument("kernel: expected one of fused, copy2d, got '" + name + "'");
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::Fused: return "fused";
    case Kernel::Copy2d: return "copy2d";
  }
  return "unknown";
}

std::vector<KernelInfo> kernel_table() {
  return {
      {"fused", 20,
       "one kernel moves every input (up to 32 per launch, their pointers and column offsets passed by value): "
       "16-byte vectors when every width, column offset and pointer allows",
       "none (the path that always works)", kFallback, kAnyAlignment},
      {"copy2d", 10, "one cudaMemcpy2DAsync per input (cudaMemcpyAsync when there is a single row)",
       "rows of y at most 2^31 - 1 bytes when there is more than one row (cudaMemcpy2D's pitch limit)"},
  };
}

namespace {

constexpr int64_t kMaxPitchBytes = 2147483647;  // cudaDevAttrMaxPitch on every current GPU

int64_t row_bytes(const Layout& layout) {
  int64_t width = 0;
  for (int64_t part : layout.widths) width += part;
  return width * static_cast<int64_t>(dtype_size(layout.dtype));
}

}  // namespace

void check_buffers(const Layout& layout, const std::vector<const void*>& parts, const void* whole,
                   const char* parts_name, const char* whole_name) {
  if (layout.widths.empty()) throw std::invalid_argument(std::string(parts_name) + ": expected at least one buffer");
  if (parts.size() != layout.widths.size()) {
    throw std::invalid_argument(std::string(parts_name) + ": expected " + std::to_string(layout.widths.size()) +
                                " buffers (one per width), got " + std::to_string(parts.size()));
  }
  if (layout.outer < 0) throw std::invalid_argument("outer: expected >= 0, got " + std::to_string(layout.outer));
  int64_t total = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const int64_t width = layout.widths[i];
    if (width < 0) throw std::invalid_argument("widths: expected >= 0, got " + std::to_string(width));
    if (width > 0 && layout.outer > 0 && parts[i] == nullptr) {
      throw std::invalid_argument(std::string(parts_name) + "[" + std::to_string(i) + "]: null device pointer");
    }
    total += width;
  }
  if (total > 0 && layout.outer > 0 && whole == nullptr) {
    throw std::invalid_argument(std::string(whole_name) + ": null device pointer");
  }
}

std::string unsupported_reason(Kernel kernel, const Layout& layout) {
  if (kernel == Kernel::Copy2d && layout.outer > 1 && row_bytes(layout) > kMaxPitchBytes) {
    return "rows of " + std::to_string(row_bytes(layout)) + " bytes exceed cudaMemcpy2D's pitch limit of " +
           std::to_string(kMaxPitchBytes);
  }
  return "";
}

void check_kernel(Kernel kernel, const Layout& layout) {
  const std::string reason = unsupported_reason(kernel, layout);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
}

Kernel forward(const std::vector<const void*>& inputs, void* y, const Layout& layout, Kernel kernel,
               cudaStream_t stream) {
  check_buffers(layout, inputs, y, "inputs", "y");
  check_kernel(kernel, layout);
  // The parts are only read in this direction; the launchers take one pointer type for both directions.
  std::vector<void*> parts;
  for (const void* input : inputs) parts.push_back(const_cast<void*>(input));
  if (kernel == Kernel::Fused) {
    launch_fused(y, parts, layout, false, stream);
  } else {
    launch_copy2d(y, parts, layout, false, stream);
  }
  return kernel;
}

void launch_copy2d(void* whole, const std::vector<void*>& parts, const Layout& layout, bool split,
                   cudaStream_t stream) {
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(layout.dtype));
  const int64_t pitch = row_bytes(layout);
  int64_t column = 0;  // bytes
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const int64_t width = layout.widths[i] * element_bytes;
    char* window = static_cast<char*>(whole) + column;
    column += width;
    if (width == 0 || layout.outer == 0) continue;
    void* dst = split ? parts[i] : window;
    const void* src = split ? static_cast<const void*>(window) : parts[i];
    if (layout.outer == 1) {
      GE2_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(width), cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    const auto dst_pitch = static_cast<std::size_t>(split ? width : pitch);
    const auto src_pitch = static_cast<std::size_t>(split ? pitch : width);
    GE2_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, static_cast<std::size_t>(width),
                                     static_cast<std::size_t>(layout.outer), cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace ge2::concat
