// concat backward: each input's gradient is its columns of dy, the same moves as the forward in the other
// direction (the fused kernel's split mode, or one cudaMemcpy2DAsync per gradient).
#include "api.hpp"
#include "status.hpp"

namespace ge2::concat {

Kernel backward(const void* dy, const std::vector<void*>& grads, const Layout& layout, Kernel kernel,
                cudaStream_t stream) {
  check_buffers(layout, std::vector<const void*>(grads.begin(), grads.end()), dy, "grads", "dy");
  check_kernel(kernel, layout);
  // dy is only read in this direction; the launchers take one pointer type for both directions.
  void* whole = const_cast<void*>(dy);
  if (kernel == Kernel::Fused) {
    launch_fused(whole, grads, layout, true, stream);
  } else {
    launch_copy2d(whole, grads, layout, true, stream);
  }
  return kernel;
}

}  // namespace ge2::concat
