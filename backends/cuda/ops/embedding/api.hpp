// embedding: out[i, :] = table[ids[i], :] for a (vocab, dim) table and `count` ids (any shape, flattened). Backward
// scatter-adds dy rows into dtable (vocab, dim), deterministically: ids are stably sorted (CUB radix sort) and each
// dtable row is the float32 sum of its dy rows in id-position order, split into fixed tiles of sorted positions
// whose partial sums are combined in tile order. No float atomics anywhere, so the result is bitwise reproducible.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"
#include "vec_kernel.hpp"

namespace ge2::embedding {

using Kernel = VecKernel;  // vec16, then scalar (_common/vec_kernel.hpp)
inline Kernel kernel_from_name(const std::string& name) { return vec_kernel_from_name(name); }
inline const char* kernel_name(Kernel kernel) { return vec_kernel_name(kernel); }

struct ForwardArgs {
  const void* table = nullptr;  // (vocab, dim), dtype
  const void* ids = nullptr;    // (count,), id_dtype (int32 or int64)
  void* out = nullptr;          // (count, dim), dtype
  int64_t vocab = 0, dim = 0, count = 0;
  DType dtype = DType::Float32;
  DType id_dtype = DType::Int64;
};

struct BackwardArgs {
  const void* dy = nullptr;   // (count, dim), dtype
  const void* ids = nullptr;  // (count,), id_dtype
  void* dtable = nullptr;     // (vocab, dim), dtype: fully overwritten (rows no id names are 0)
  int64_t vocab = 0, dim = 0, count = 0;
  DType dtype = DType::Float32;
  DType id_dtype = DType::Int64;
};

// Runs `kernel` (std::invalid_argument when it cannot run the problem) and returns it. With check_ids, an id
// outside [0, vocab) raises std::invalid_argument after the launch (this waits for the stream); without, its
// output row is NaN (forward) or its dy row is skipped (backward) and the call stays asynchronous.
Kernel forward(const ForwardArgs& args, Kernel kernel, bool check_ids, cudaStream_t stream);
void backward(const BackwardArgs& args, bool check_ids, cudaStream_t stream);

// Empty when `kernel` can run rows of `dim` elements; otherwise the reason it cannot. `aligned`: the table and
// output pointers are 16-byte aligned.
std::string unsupported_reason(Kernel kernel, int64_t dim, DType dtype, bool aligned);

std::vector<KernelInfo> kernel_table();

// ---- internal: shared by launcher.cu, kernels/*.cu and backward.cu ------------------------------------------

void launch_gather(const ForwardArgs& args, bool vectorized, unsigned long long* id_error, cudaStream_t stream);

// With the stream finished, throws std::invalid_argument naming the first id outside [0, vocab), if any.
void throw_if_bad_id(const unsigned long long* id_error, const void* ids, DType id_dtype, int64_t vocab,
                     cudaStream_t stream);

// Lanes that share one row: the row's pack count rounded up to a power of two, at most a warp.
int lanes_per_row(int64_t packs_per_row);

}  // namespace ge2::embedding
