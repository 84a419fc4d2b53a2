// cudnn: cuDNN's fused scaled dot-product attention through the cuDNN frontend (header-only C++): Graph::sdpa
// with generate_stats for the forward, Graph::sdpa_backward for dQ, dK, dV. Compiled only when CMake found cuDNN
// and the frontend headers (GE2_WITH_CUDNN_FRONTEND). Host code only, so it compiles as C++.
//
// GE2's contract maps onto cuDNN's as it stands: the layouts are strides of [batch, heads, seq, head_dim] tensors;
// grouped K/V heads are K/V tensors of heads_kv heads (cuDNN needs heads_q % heads_kv == 0, and sums dK, dV over
// each group); causal is set_causal_mask, the top-left diagonal (query row i sees keys j <= i, PyTorch's
// is_causal; set_causal_mask_bottom_right is the other alignment); the scale is the attn_scale value; the additive
// bias is set_bias (broadcast over a batch or head axis of extent 1; no dBias: a mask has no gradient here). The
// sliding window is cuDNN's diagonal band: right bound = right, left bound = left + 1 (cuDNN keeps keys with
// j + left_bound > i), bottom-right aligned where seq_q != seq_k (TOP_LEFT, the same mask, where they are equal, so
// that causal combines with it as right = min(right, 0)). Declined: a soft cap (cuDNN's SDPA node has none), rows with
// no visible key (GE2 gives them O = 0 and lse = +inf; cuDNN's output there is not specified), causal with a window
// when seq_q != seq_k (the band has one alignment, causal is top-left and the window bottom-right) and a left bound
// with seq_q > seq_k (the frontend refuses it). cuDNN's
// Stats is the natural-log log-sum-exp of the scaled scores, [batch, heads_q, seq_q, 1] float32: GE2's lse with a
// unit last dimension, so the forward writes lse in place and the backward reads any candidate's lse as Stats.
// Plans per problem, built and timed as _common/cudnn_graph_plans.hpp says.
#include "api.hpp"
#include "cudnn_build.hpp"

#if GE2_WITH_CUDNN_FRONTEND
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "cudnn_graph_plans.hpp"
#include "status.hpp"
#endif

namespace ge2::attention {

std::string cudnn_not_built_reason() { return cudnn_frontend_not_built_reason(); }

#if !GE2_WITH_CUDNN_FRONTEND

std::string cudnn_unsupported_reason(const Shape&) { return "not built: " + cudnn_not_built_reason(); }
void cudnn_prepare(const Shape&, bool) { throw std::logic_error("attention: built without the cuDNN frontend"); }
std::string cudnn_forward(const ForwardArgs&, cudaStream_t) {
  throw std::logic_error("attention: built without the cuDNN frontend");
}
std::string cudnn_backward(const BackwardArgs&, cudaStream_t) {
  throw std::logic_error("attention: built without the cuDNN frontend");
}

#else

namespace {

namespace fe = cudnn_graph::fe;
using cudnn_graph::GraphPlan;
using cudnn_graph::VariantPack;

constexpr const char* kKernel = "cudnn";

// The constraints of cuDNN's 16-bit SDPA on every architecture it runs on (forward and backward; sm_90 takes
// head_dim up to 256, older ones up to 128: the build of the plans says no there, and the selector takes the next
// candidate).
std::string constraint_reason(const Shape& shape) {
  if (shape.dtype != DType::Float16 && shape.dtype != DType::BFloat16) {
    return std::string("cudnn runs cuDNN's fused SDPA, which takes float16 and bfloat16: got ") +
           dtype_name(shape.dtype);
  }
  if (shape.head_dim % 8 != 0 || shape.head_dim > kMaxCudnnHeadDim) {
    return "cudnn (cuDNN's fused SDPA) needs head_dim a multiple of 8 and <= " + std::to_string(kMaxCudnnHeadDim) +
           ", got head_dim " + std::to_string(shape.head_dim);
  }
  if (shape.softcap > 0.0f) return "cudnn (cuDNN's fused SDPA) has no logit soft cap (flash, rowwise and unfused have one)";
  if (!shape.has_window()) return "";
  if (shape.has_empty_rows()) {
    return "cudnn (cuDNN's fused SDPA) does not specify the output of a query row with no visible key, which this "
           "window leaves (GE2: y = 0, lse = +inf)";
  }
  if (shape.causal && shape.seq_q != shape.seq_k) {
    return "cudnn (cuDNN's fused SDPA) takes causal (top-left) with a window (bottom-right) only where seq_q == "
           "seq_k: its diagonal band has one alignment";
  }
  if (shape.window_left >= 0 && shape.seq_q > shape.seq_k) {
    return "cudnn (cuDNN's fused SDPA) takes a window's left bound only where seq_q <= seq_k";
  }
  return "";
}

// The graphs' tensors, by uid: the variant pack's keys.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv, kBias };

fe::DataType_t io_type(DType dtype) {
  return dtype == DType::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// Dims [batch, heads, seq, head_dim] and the strides of the problem's layout.
std::vector<int64_t> dims_of(const Shape& s, int64_t heads, int64_t seq) { return {s.batch, heads, seq, s.head_dim}; }
std::vector<int64_t> strides_of(const Shape& s, int64_t heads, int64_t seq) {
  const int64_t d = s.head_dim;
  if (s.seq_major) return {seq * heads * d, d, heads * d, 1};
  return {heads * seq * d, seq * d, d, 1};
}

std::vector<int64_t> key_of(const Shape& s, bool backward) {
  int32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.scale, sizeof(scale_bits));
  return {current_device(), s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim, s.seq_major, scale_bits,
          s.causal, static_cast<int64_t>(s.dtype), backward, s.bias_batch, s.bias_heads, s.window_left,
          s.window_right};
}

// Causal and the window as cuDNN's diagonal band on the attributes of sdpa or sdpa_backward (constraint_reason has
// declined what it cannot express).
template <typename Attributes>
void set_mask(Attributes& attributes, const Shape& s) {
  if (!s.has_window()) {
    if (s.causal) attributes.set_causal_mask(true);
    return;
  }
  attributes.set_diagonal_alignment(s.seq_q == s.seq_k ? fe::DiagonalAlignment_t::TOP_LEFT
                                                       : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
  const int64_t right = s.causal ? 0 : s.window_right;  // causal: min(right, 0), -1 being unbounded
  if (right >= 0) attributes.set_diagonal_band_right_bound(static_cast<int>(right));
  if (s.window_left >= 0) attributes.set_diagonal_band_left_bound(static_cast<int>(s.window_left + 1));
}

// The tensors and the SDPA node (forward or backward) of the problem in `graph`.
void add_nodes(fe::graph::Graph& graph, const Shape& s, bool backward) {
  const fe::DataType_t io = io_type(s.dtype);
  graph.set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
      fe::DataType_t::FLOAT);
  auto tensor = [&](Uid uid, const char* name, int64_t heads, int64_t seq) {
    return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(s, heads, seq))
                            .set_stride(strides_of(s, heads, seq)).set_data_type(io));
  };
  auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, int64_t heads, int64_t seq) {
    t->set_output(true).set_uid(uid).set_dim(dims_of(s, heads, seq)).set_stride(strides_of(s, heads, seq))
        .set_data_type(io);
  };
  // GE2's lse [batch, heads_q, seq_q] is cuDNN's packed Stats [batch, heads_q, seq_q, 1].
  const std::vector<int64_t> stats_dims = {s.batch, s.heads_q, s.seq_q, 1},
                             stats_strides = {s.heads_q * s.seq_q, s.seq_q, 1, 1};
  auto q = tensor(kQ, "q", s.heads_q, s.seq_q);
  auto k = tensor(kK, "k", s.heads_kv, s.seq_k);
  auto v = tensor(kV, "v", s.heads_kv, s.seq_k);
  // The additive bias, contiguous [bias_batch, bias_heads, seq_q, seq_k] (extent-1 axes broadcast).
  std::shared_ptr<fe::graph::Tensor_attributes> bias;
  if (s.has_bias()) {
    bias = graph.tensor(fe::graph::Tensor_attributes().set_name("bias").set_uid(kBias)
                            .set_dim({s.bias_batch, s.bias_heads, s.seq_q, s.seq_k})
                            .set_stride({s.bias_heads * s.seq_q * s.seq_k, s.seq_q * s.seq_k, s.seq_k, 1})
                            .set_data_type(io));
  }
  if (!backward) {
    auto attributes = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(s.scale);
    set_mask(attributes, s);
    if (bias) attributes.set_bias(bias);
    auto [o, stats] = graph.sdpa(q, k, v, attributes);
    output(o, kO, s.heads_q, s.seq_q);
    stats->set_output(true).set_uid(kStats).set_dim(stats_dims).set_stride(stats_strides).set_data_type(
        fe::DataType_t::FLOAT);
    return;
  }
  auto o = tensor(kO, "o", s.heads_q, s.seq_q);
  auto dout = tensor(kDo, "dout", s.heads_q, s.seq_q);
  auto stats = graph.tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats).set_dim(stats_dims)
                                .set_stride(stats_strides).set_data_type(fe::DataType_t::FLOAT));
  auto attributes = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(s.scale);
  set_mask(attributes, s);
  if (bias) attributes.set_bias(bias);
  auto [dq, dk, dv] = graph.sdpa_backward(q, k, v, o, dout, stats, attributes);
  output(dq, kDq, s.heads_q, s.seq_q);
  output(dk, kDk, s.heads_kv, s.seq_k);
  output(dv, kDv, s.heads_kv, s.seq_k);
}

// The cached plans of the problem; the caller holds the handle lock. No numerical note is left out: every SDPA
// engine keeps its softmax statistics and accumulators in float32.
GraphPlan& plan_for(const Shape& shape, bool backward, cudnnHandle_t handle, cudaStream_t stream, bool on_stream) {
  return cudnn_graph::GraphPlans::instance().plan_for(
      key_of(shape, backward), [&](fe::graph::Graph& graph) { add_nodes(graph, shape, backward); }, {}, handle,
      stream, on_stream, kKernel);
}

// Runs the problem's plan on `pack`: empty when it ran, else why cuDNN declined (enqueuing nothing).
std::string run(const Shape& shape, bool backward, VariantPack& pack, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  cudnnHandle_t handle = CudnnHandles::instance().bound_to(stream);
  GraphPlan& plan = plan_for(shape, backward, handle, stream, /*on_stream=*/true);
  if (plan.graph == nullptr) return cudnn_graph::no_engine(plan);
  cudnn_graph::tune(plan, handle, pack, stream, kKernel);
  void* workspace = plan.workspace > 0 ? StreamWorkspace::get(static_cast<std::size_t>(plan.workspace), stream)
                                       : nullptr;
  cudnn_graph::execute(plan, handle, pack, workspace, kKernel);
  return "";
}

}  // namespace


std::string cudnn_unsupported_reason(const Shape& shape) { return constraint_reason(shape); }

void cudnn_prepare(const Shape& shape, bool backward) {
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  cudnnHandle_t handle = CudnnHandles::instance().current();
  const GraphPlan& plan = plan_for(shape, backward, handle, nullptr, /*on_stream=*/false);
  if (plan.graph == nullptr) {
    throw std::runtime_error(cudnn_graph::kernel_prefix(kKernel) + cudnn_graph::no_engine(plan));
  }
}

std::string cudnn_forward(const ForwardArgs& args, cudaStream_t stream) {
  if (!cudnn_graph::aligned({args.q, args.k, args.v, args.o, args.lse})) return cudnn_graph::kMisaligned;
  if (args.bias != nullptr && !cudnn_graph::aligned({args.bias})) return cudnn_graph::kMisaligned;
  VariantPack pack = {{kQ, const_cast<void*>(args.q)}, {kK, const_cast<void*>(args.k)},
                      {kV, const_cast<void*>(args.v)}, {kO, args.o}, {kStats, args.lse}};
  if (args.bias != nullptr) pack[kBias] = const_cast<void*>(args.bias);
  return run(args.shape, /*backward=*/false, pack, stream);
}

std::string cudnn_backward(const BackwardArgs& args, cudaStream_t stream) {
  if (!cudnn_graph::aligned({args.dout, args.q, args.k, args.v, args.o, args.lse, args.dq, args.dk, args.dv})) {
    return cudnn_graph::kMisaligned;
  }
  VariantPack pack = {{kQ, const_cast<void*>(args.q)},       {kK, const_cast<void*>(args.k)},
                      {kV, const_cast<void*>(args.v)},       {kO, const_cast<void*>(args.o)},
                      {kDo, const_cast<void*>(args.dout)},   {kStats, const_cast<float*>(args.lse)},
                      {kDq, args.dq},                        {kDk, args.dk},
                      {kDv, args.dv}};
  if (args.bias != nullptr) {
    if (!cudnn_graph::aligned({args.bias})) return cudnn_graph::kMisaligned;
    pack[kBias] = const_cast<void*>(args.bias);
  }
  return run(args.shape, /*backward=*/true, pack, stream);
}

#endif

}  // namespace ge2::attention
