// layernorm and rmsnorm forward: the row-norm checks and kernels (row_norm_kernels.hpp) for the variant of the module
// being built (kOpCentered: layernorm centered, rmsnorm not).
#include "api.hpp"
#include "row_norm_kernels.hpp"

namespace ge2::row_norm {

template Kernel forward<kOpCentered>(const Forward& args, Kernel kernel, cudaStream_t stream);

}  // namespace ge2::row_norm
