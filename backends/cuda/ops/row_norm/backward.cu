// layernorm and rmsnorm backward: dx per row and deterministic column sums for the parameter gradients
// (row_norm_kernels.hpp), for the variant of the module being built (kOpCentered).
#include "api.hpp"
#include "row_norm_kernels.hpp"

namespace ge2::row_norm {

template Kernel backward<kOpCentered>(const Backward& args, Kernel kernel, cudaStream_t stream);
template std::size_t backward_workspace_bytes<kOpCentered>(int64_t rows, int64_t cols, DType dtype, bool aligned,
                                                           Kernel kernel);

}  // namespace ge2::row_norm
