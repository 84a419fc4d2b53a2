// _ops_dropout: the native face of the dropout op. Raw device addresses and sizes in, work enqueued on `stream`;
// argument checking for users happens in graph_executor_v2.ops.dropout first.
#include <array>

#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"
#include "philox.cuh"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

namespace {

// Forward (x -> y) and backward (dy -> dx) are the same masked scaling; the mask is regenerated from the seed.
std::string run(std::uintptr_t source, std::uintptr_t destination, int64_t count, const std::string& dtype, double p,
                uint64_t seed, uint64_t offset, const std::string& kernel, std::uintptr_t stream) {
  ge2::dropout::Args args;
  args.x = as_pointer(source);
  args.y = as_pointer(destination);
  args.count = count;
  args.dtype = ge2::dtype_from_name(dtype);
  args.p = p;
  args.seed = seed;
  args.offset = offset;
  const auto requested = ge2::dropout::kernel_from_name(kernel);
  ge2::binding::ReleaseGil release;
  return ge2::dropout::kernel_name(ge2::dropout::run(args, requested, as_stream(stream)));
}

}  // namespace

PYBIND11_MODULE(_ops_dropout, m) {
  m.doc() = "GE2 dropout: y = x * mask / (1 - p) with a Philox4x32-10 mask keyed by (seed, offset + index)";

  m.def("forward", &run, py::arg("x"), py::arg("y"), py::arg("count"), py::arg("dtype"), py::arg("p"),
        py::arg("seed"), py::arg("offset"), py::arg("kernel"), py::arg("stream"),
        "Enqueues y = x * mask / (1 - p) (y may be x); returns the kernel that ran.");
  m.def("backward", &run, py::arg("dy"), py::arg("dx"), py::arg("count"), py::arg("dtype"), py::arg("p"),
        py::arg("seed"), py::arg("offset"), py::arg("kernel"), py::arg("stream"),
        "Enqueues dx = dy * mask / (1 - p), regenerating forward's mask from (seed, offset).");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, uint64_t offset, bool aligned) {
        return ge2::dropout::unsupported_reason(ge2::dropout::kernel_from_name(kernel), offset, aligned);
      },
      py::arg("kernel"), py::arg("offset"), py::arg("aligned"),
      "Empty string when the kernel can run the problem, else the reason it cannot.");

  m.def(
      "philox4x32_10",
      [](const std::array<uint32_t, 4>& counter, const std::array<uint32_t, 2>& key) {
        const auto words = ge2::dropout::philox4x32_10({{counter[0], counter[1], counter[2], counter[3]}}, key[0],
                                                       key[1]);
        return std::array<uint32_t, 4>{words.w[0], words.w[1], words.w[2], words.w[3]};
      },
      py::arg("counter"), py::arg("key"),
      "The kernels' Philox4x32-10, run on the host (no GPU needed): for known-answer tests.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::dropout::kernel_table()); });
}
