// layernorm backward: dx per row and deterministic column sums for the parameter gradients
// (_common/row_norm_kernels.hpp, centered).
#include "api.hpp"
#include "row_norm_kernels.hpp"

namespace ge2::row_norm {

template Kernel backward<true>(const Backward& args, Kernel requested, cudaStream_t stream);
template std::size_t backward_workspace_bytes<true>(int64_t rows, int64_t cols, DType dtype, bool aligned,
                                                    Kernel requested);

}  // namespace ge2::row_norm
