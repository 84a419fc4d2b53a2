// layernorm forward: the shared row-norm checks and kernels (_common/row_norm_kernels.hpp), centered.
#include "api.hpp"
#include "row_norm_kernels.hpp"

namespace ge2::row_norm {

template Kernel forward<true>(const Forward& args, Kernel requested, cudaStream_t stream);

}  // namespace ge2::row_norm
