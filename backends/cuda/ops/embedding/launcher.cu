// embedding launcher: argument checks, the id-error slot (in the module's stream workspace) and the named forward
// kernel's check.
#include <cstdint>
#include <string>

#include "api.hpp"
#include "index_checks.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"
#include "vector_access.hpp"

namespace ge2::embedding {

std::vector<KernelInfo> kernel_table() {
  return with_dtypes({
      {"vec16", 20, "row gather with 16-byte loads and stores, a power-of-two group of lanes per row",
       "dim % (16 / itemsize) == 0; table and output 16-byte aligned"},
      {"scalar", 10, "row gather element by element: the path that always works", "none", kFallback, kAnyAlignment},
  }, floating_dtypes());
}

std::string unsupported_reason(Kernel kernel, int64_t dim, DType dtype, bool aligned) {
  if (kernel != Kernel::Vec16) return "";
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(dtype));
  if (dim % vec != 0) return "dim " + std::to_string(dim) + " is not a multiple of " + std::to_string(vec);
  if (!aligned) return "table or output is not 16-byte aligned";
  return "";
}

void throw_if_bad_id(const unsigned long long* id_error, const void* ids, DType id_dtype, int64_t vocab,
                     cudaStream_t stream) {
  const IndexError error = take_index_error(id_error, ids, id_dtype, stream);
  if (error.position >= 0) {
    throw std::invalid_argument("ids: id " + std::to_string(error.value) + " at position " +
                                std::to_string(error.position) + " is outside [0, " + std::to_string(vocab) + ")");
  }
}

namespace {

void check_forward_args(const ForwardArgs& args) {
  if (args.vocab < 1) throw std::invalid_argument("vocab: expected >= 1, got " + std::to_string(args.vocab));
  if (args.dim < 1) throw std::invalid_argument("dim: expected >= 1, got " + std::to_string(args.dim));
  if (args.count < 0) throw std::invalid_argument("ids: expected a count >= 0, got " + std::to_string(args.count));
  if (!is_floating(args.dtype)) {
    throw std::invalid_argument(std::string("dtype: expected float32, float16 or bfloat16, got ") +
                                dtype_name(args.dtype));
  }
  if (args.id_dtype != DType::Int32 && args.id_dtype != DType::Int64) {
    throw std::invalid_argument(std::string("ids: expected dtype int32 or int64, got ") + dtype_name(args.id_dtype));
  }
  if (args.count == 0) return;
  if (args.table == nullptr) throw std::invalid_argument("table: null device pointer");
  if (args.ids == nullptr) throw std::invalid_argument("ids: null device pointer");
  if (args.out == nullptr) throw std::invalid_argument("out: null device pointer");
}

}  // namespace

Kernel forward(const ForwardArgs& args, Kernel kernel, bool check_ids, cudaStream_t stream) {
  check_forward_args(args);
  const bool aligned = is_aligned(args.table, 16) && is_aligned(args.out, 16);
  const std::string reason = unsupported_reason(kernel, args.dim, args.dtype, aligned);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("kernel: '") + kernel_name(kernel) + "' cannot run this problem: " +
                                reason);
  }
  if (args.count == 0) return kernel;
  auto* id_error = static_cast<unsigned long long*>(StreamWorkspace::get(sizeof(unsigned long long), stream));
  if (check_ids) reset_index_error(id_error, stream);
  launch_gather(args, kernel == Kernel::Vec16, id_error, stream);
  if (check_ids) throw_if_bad_id(id_error, args.ids, args.id_dtype, args.vocab, stream);
  return kernel;
}

}  // namespace ge2::embedding
