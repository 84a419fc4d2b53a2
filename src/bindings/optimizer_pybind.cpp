// _ops_optimizer: the native face of the fused multi-tensor optimizer. Device addresses of the tensor table, the
// chunk table, the Control block and the norm partials come in (graph_executor_v2.ops.optimizer builds them once
// and checks hyper-parameters); each call enqueues one launch on `stream`.
#include <cstddef>

#include "api.hpp"
#include "kernel_list.hpp"
#include "op_binding.hpp"

namespace py = pybind11;
using ge2::binding::as_pointer;
using ge2::binding::as_stream;
namespace opt = ge2::optimizer;

namespace {

opt::Algorithm algorithm_from_name(const std::string& name) {
  if (name == "sgd") return opt::Algorithm::SGD;
  if (name == "adam") return opt::Algorithm::Adam;
  throw std::invalid_argument("algorithm: expected 'sgd' or 'adam', got '" + name + "'");
}

opt::Schedule schedule_from_name(const std::string& name) {
  if (name == "constant") return opt::Schedule::Constant;
  if (name == "linear_warmup") return opt::Schedule::LinearWarmup;
  if (name == "cosine") return opt::Schedule::Cosine;
  throw std::invalid_argument("schedule: expected 'constant', 'linear_warmup' or 'cosine', got '" + name + "'");
}

opt::GroupTables group_tables(std::uintptr_t tensors, std::uintptr_t chunks, int64_t num_chunks, int64_t chunk_size,
                              const std::string& grad_dtype) {
  opt::GroupTables group;
  group.tensors = as_pointer<const opt::TensorEntry>(tensors);
  group.chunks = as_pointer<const opt::ChunkEntry>(chunks);
  group.num_chunks = num_chunks;
  group.chunk_size = chunk_size;
  group.grad_dtype = ge2::dtype_from_name(grad_dtype, "grad_dtype");
  return group;
}

void grad_norm(std::uintptr_t tensors, std::uintptr_t chunks, int64_t num_chunks, int64_t chunk_size,
               const std::string& grad_dtype, std::uintptr_t control, std::uintptr_t partials, bool unscale,
               std::uintptr_t stream) {
  opt::NormArgs args;
  args.group = group_tables(tensors, chunks, num_chunks, chunk_size, grad_dtype);
  args.control = as_pointer<opt::Control>(control);
  args.partials = as_pointer<float>(partials);
  args.unscale = unscale;
  ge2::binding::ReleaseGil release;
  opt::grad_norm(args, as_stream(stream));
}

void finalize(std::uintptr_t control, std::uintptr_t partials, int64_t num_partials, bool scaling,
              bool skip_nonfinite, double max_norm,
              const std::string& schedule, double lr, double min_lr, int64_t warmup_steps, int64_t total_steps,
              const std::string& algorithm, double beta1, double beta2, double weight_decay, double growth_factor,
              double backoff_factor, int64_t growth_interval, std::uintptr_t stream) {
  opt::FinalizeArgs args;
  args.control = as_pointer<opt::Control>(control);
  args.partials = as_pointer<const float>(partials);
  args.num_partials = num_partials;
  args.scaling = scaling;
  args.skip_nonfinite = skip_nonfinite;
  args.max_norm = static_cast<float>(max_norm);
  args.schedule = schedule_from_name(schedule);
  args.lr = lr;
  args.min_lr = min_lr;
  args.warmup_steps = warmup_steps;
  args.total_steps = total_steps;
  args.algorithm = algorithm_from_name(algorithm);
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.weight_decay = weight_decay;
  args.growth_factor = static_cast<float>(growth_factor);
  args.backoff_factor = static_cast<float>(backoff_factor);
  args.growth_interval = growth_interval;
  ge2::binding::ReleaseGil release;
  opt::finalize(args, as_stream(stream));
}

void step(std::uintptr_t tensors, std::uintptr_t chunks, int64_t num_chunks, int64_t chunk_size,
          const std::string& algorithm, const std::string& grad_dtype, const std::string& low_dtype,
          std::uintptr_t control, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
          bool amsgrad, double momentum, double dampening, bool nesterov, bool scaling, bool clipping,
          std::uintptr_t stream) {
  opt::StepArgs args;
  args.group = group_tables(tensors, chunks, num_chunks, chunk_size, grad_dtype);
  args.algorithm = algorithm_from_name(algorithm);
  args.has_low = !low_dtype.empty();
  if (args.has_low) args.low_dtype = ge2::dtype_from_name(low_dtype, "low_dtype");
  args.control = as_pointer<const opt::Control>(control);
  // torch rounds each Python-float scalar (1 - beta1, 1 - beta2, 1 - dampening) from double: so do we.
  args.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  args.beta2 = static_cast<float>(beta2);
  args.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  args.eps = static_cast<float>(eps);
  args.weight_decay = static_cast<float>(weight_decay);
  args.decoupled = decoupled;
  args.amsgrad = amsgrad;
  args.momentum = static_cast<float>(momentum);
  args.one_minus_dampening = static_cast<float>(1.0 - dampening);
  args.nesterov = nesterov;
  args.scaling = scaling;
  args.clipping = clipping;
  ge2::binding::ReleaseGil release;
  opt::step(args, as_stream(stream));
}

py::dict control_layout() {
  py::dict layout;
  layout["step"] = py::make_tuple(offsetof(opt::Control, step), "int64");
  layout["good_steps"] = py::make_tuple(offsetof(opt::Control, good_steps), "int64");
  layout["loss_scale"] = py::make_tuple(offsetof(opt::Control, loss_scale), "float32");
  layout["grad_norm"] = py::make_tuple(offsetof(opt::Control, grad_norm), "float32");
  layout["lr"] = py::make_tuple(offsetof(opt::Control, lr), "float32");
  layout["skipped"] = py::make_tuple(offsetof(opt::Control, skipped), "int32");
  layout["nonfinite"] = py::make_tuple(offsetof(opt::Control, nonfinite), "int32");
  layout["nonfinite_steps"] = py::make_tuple(offsetof(opt::Control, nonfinite_steps), "int32");
  layout["first_nonfinite"] = py::make_tuple(offsetof(opt::Control, first_nonfinite), "int32");
  return layout;
}

}  // namespace

PYBIND11_MODULE(_ops_optimizer, m) {
  m.doc() = "GE2 fused multi-tensor optimizer: grad_norm -> finalize -> step, all state on the device";

  m.def("grad_norm", &grad_norm, py::arg("tensors"), py::arg("chunks"), py::arg("num_chunks"),
        py::arg("chunk_size"), py::arg("grad_dtype"), py::arg("control"), py::arg("partials"), py::arg("unscale"),
        py::arg("stream"), "Enqueues the per-chunk sums of squares of (unscaled) gradients and the overflow flag.");
  m.def("finalize", &finalize, py::arg("control"), py::arg("partials"), py::arg("num_partials"),
        py::arg("scaling"), py::arg("skip_nonfinite"), py::arg("max_norm"), py::arg("schedule"), py::arg("lr"), py::arg("min_lr"),
        py::arg("warmup_steps"), py::arg("total_steps"), py::arg("algorithm"), py::arg("beta1"), py::arg("beta2"),
        py::arg("weight_decay"), py::arg("growth_factor"), py::arg("backoff_factor"), py::arg("growth_interval"),
        py::arg("stream"),
        "Enqueues the one-block step prologue: global norm, skip decision (overflow, non-finite), step counter, schedule, loss scale.");
  m.def("step", &step, py::arg("tensors"), py::arg("chunks"), py::arg("num_chunks"), py::arg("chunk_size"),
        py::arg("algorithm"), py::arg("grad_dtype"), py::arg("low_dtype"), py::arg("control"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("decoupled"), py::arg("amsgrad"),
        py::arg("momentum"), py::arg("dampening"), py::arg("nesterov"), py::arg("scaling"), py::arg("clipping"),
        py::arg("stream"), "Enqueues the update of every tensor of one dtype group (low_dtype '' for no copies).");
  m.def(
      "copy_buffers",
      [](std::uintptr_t entries, int64_t count, std::uintptr_t stream) {
        ge2::binding::ReleaseGil release;
        opt::copy_buffers(as_pointer<const opt::CopyEntry>(entries), count, as_stream(stream));
      },
      py::arg("entries"), py::arg("count"), py::arg("stream"),
      "Enqueues every copy of a device table of int64[4] rows (source, destination, bytes, 0) in one launch.");
  m.def("copy_entry_bytes", [] { return sizeof(opt::CopyEntry); });
  m.def("control_layout", &control_layout, "Control block fields: name -> (byte offset, dtype).");
  m.def("control_bytes", [] { return sizeof(opt::Control); });
  m.def("entry_bytes", [] { return sizeof(opt::TensorEntry); });
  m.def("kernels", [] { return ge2::binding::kernel_list(ge2::optimizer::kernel_table()); });
}
