// _ops_collectives: the native face of NCCL for ge2.distributed. Raw device addresses, counts, a dtype name and a
// stream handle; the Python layer (graph_executor_v2.distributed) validates arguments and owns the process group.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_collectives, m) {
  namespace collectives = ge2::collectives;
  m.doc() = "GE2 collectives: NCCL communicators, all-reduce and broadcast on device buffers";

  m.def("nccl_version", &collectives::nccl_version);
  m.def("unique_id", [] { return py::bytes(collectives::unique_id()); },
        "128 opaque bytes rank 0 makes and every rank passes to create().");
  m.def(
      "create",
      [](py::bytes id, int world, int rank, int device, double timeout_s) {
        const std::string raw = id;
        ge2::binding::ReleaseGil release;
        return collectives::create(raw, world, rank, device, timeout_s);
      },
      py::arg("id"), py::arg("world"), py::arg("rank"), py::arg("device"), py::arg("timeout_s"),
      "Joins the communicator of `world` ranks; returns its handle. Raises when the others do not join in time.");
  m.def(
      "all_reduce",
      [](int64_t handle, std::uintptr_t send, std::uintptr_t recv, int64_t count, const std::string& dtype,
         const std::string& reduction, std::uintptr_t stream, double timeout_s) {
        const auto type = ge2::dtype_from_name(dtype);
        const auto op = collectives::reduction_from_name(reduction);
        ge2::binding::ReleaseGil release;
        collectives::all_reduce(handle, as_pointer<const void>(send), as_pointer(recv), count, type, op,
                                as_stream(stream), timeout_s);
      },
      py::arg("handle"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("reduction"),
      py::arg("stream"), py::arg("timeout_s"));
  m.def(
      "all_reduce_group",
      [](int64_t handle, const std::vector<std::uintptr_t>& sends, const std::vector<std::uintptr_t>& recvs,
         const std::vector<int64_t>& counts, const std::vector<std::string>& dtypes, const std::string& reduction,
         std::uintptr_t stream, double timeout_s) {
        if (recvs.size() != sends.size() || counts.size() != sends.size() || dtypes.size() != sends.size()) {
          throw std::invalid_argument("sends, recvs, counts, dtypes: expected lists of one length, got " +
                                      std::to_string(sends.size()) + ", " + std::to_string(recvs.size()) + ", " +
                                      std::to_string(counts.size()) + ", " + std::to_string(dtypes.size()));
        }
        std::vector<collectives::Buffer> buffers(sends.size());
        for (std::size_t i = 0; i < sends.size(); ++i) {
          buffers[i] = {as_pointer<const void>(sends[i]), as_pointer(recvs[i]), counts[i],
                        ge2::dtype_from_name(dtypes[i])};
        }
        const auto op = collectives::reduction_from_name(reduction);
        ge2::binding::ReleaseGil release;
        collectives::all_reduce_group(handle, buffers, op, as_stream(stream), timeout_s);
      },
      py::arg("handle"), py::arg("sends"), py::arg("recvs"), py::arg("counts"), py::arg("dtypes"),
      py::arg("reduction"), py::arg("stream"), py::arg("timeout_s"),
      "One bucket: the all-reduces of several buffers as one NCCL group.");
  m.def(
      "broadcast",
      [](int64_t handle, std::uintptr_t send, std::uintptr_t recv, int64_t count, const std::string& dtype, int root,
         std::uintptr_t stream, double timeout_s) {
        const auto type = ge2::dtype_from_name(dtype);
        ge2::binding::ReleaseGil release;
        collectives::broadcast(handle, as_pointer<const void>(send), as_pointer(recv), count, type, root,
                               as_stream(stream), timeout_s);
      },
      py::arg("handle"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"),
      py::arg("stream"), py::arg("timeout_s"));
  m.def("async_error", &collectives::async_error, py::arg("handle"),
        "'' while the communicator is healthy, else NCCL's description of its asynchronous error.");
  m.def("abort", &collectives::abort, py::arg("handle"), py::call_guard<py::gil_scoped_release>());
  m.def("destroy", &collectives::destroy, py::arg("handle"), py::call_guard<py::gil_scoped_release>());
  m.def("kernels", [] { return ge2::binding::kernel_list(collectives::kernel_table()); });
}
