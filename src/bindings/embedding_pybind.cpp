// _ops_embedding: the native face of the embedding op. Raw device addresses and sizes in, work enqueued on
// `stream`; argument checking for users happens in graph_executor_v2.ops.embedding first.
#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;

PYBIND11_MODULE(_ops_embedding, m) {
  m.doc() = "GE2 embedding: row gather from a (vocab, dim) table, deterministic scatter-add backward";

  m.def(
      "forward",
      [](std::uintptr_t table, std::uintptr_t ids, std::uintptr_t out, int64_t vocab, int64_t dim, int64_t count,
         const std::string& dtype, const std::string& id_dtype, const std::string& kernel, bool check_ids,
         std::uintptr_t stream) {
        ge2::embedding::ForwardArgs args;
        args.table = as_pointer(table);
        args.ids = as_pointer(ids);
        args.out = as_pointer(out);
        args.vocab = vocab;
        args.dim = dim;
        args.count = count;
        args.dtype = ge2::dtype_from_name(dtype);
        args.id_dtype = ge2::dtype_from_name(id_dtype, "ids");
        const auto requested = ge2::embedding::kernel_from_name(kernel);
        ge2::binding::ReleaseGil release;
        return std::string(
            ge2::embedding::kernel_name(ge2::embedding::forward(args, requested, check_ids, as_stream(stream))));
      },
      py::arg("table"), py::arg("ids"), py::arg("out"), py::arg("vocab"), py::arg("dim"), py::arg("count"),
      py::arg("dtype"), py::arg("id_dtype"), py::arg("kernel"), py::arg("check_ids"), py::arg("stream"),
      "Enqueues out[i] = table[ids[i]]; returns the kernel that ran. check_ids waits for the stream and raises "
      "ValueError on an id outside [0, vocab).");

  m.def(
      "backward",
      [](std::uintptr_t dy, std::uintptr_t ids, std::uintptr_t dtable, int64_t vocab, int64_t dim, int64_t count,
         const std::string& dtype, const std::string& id_dtype, bool check_ids, std::uintptr_t stream) {
        ge2::embedding::BackwardArgs args;
        args.dy = as_pointer(dy);
        args.ids = as_pointer(ids);
        args.dtable = as_pointer(dtable);
        args.vocab = vocab;
        args.dim = dim;
        args.count = count;
        args.dtype = ge2::dtype_from_name(dtype);
        args.id_dtype = ge2::dtype_from_name(id_dtype, "ids");
        ge2::binding::ReleaseGil release;
        ge2::embedding::backward(args, check_ids, as_stream(stream));
      },
      py::arg("dy"), py::arg("ids"), py::arg("dtable"), py::arg("vocab"), py::arg("dim"), py::arg("count"),
      py::arg("dtype"), py::arg("id_dtype"), py::arg("check_ids"), py::arg("stream"),
      "Enqueues dtable = scatter-add of dy rows by id (deterministic; rows no id names are 0).");

  m.def(
      "unsupported_reason",
      [](const std::string& kernel, int64_t dim, const std::string& dtype, bool aligned) {
        return ge2::embedding::unsupported_reason(ge2::embedding::kernel_from_name(kernel), dim,
                                                  ge2::dtype_from_name(dtype), aligned);
      },
      py::arg("kernel"), py::arg("dim"), py::arg("dtype"), py::arg("aligned"),
      "Empty string when the kernel can run rows of this length, else the reason it cannot.");

  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::embedding::kernel_table()); });
}
