// cudnn_graph: cuDNN's graph API through the cuDNN frontend (header-only C++): conv_fprop with the bias add, the
// residual add, the activation and the clip as fused pointwise nodes (float32 intermediates: y is rounded once) where
// cuDNN's runtime fusion runs, else followed by GE2's epilogue kernel (see forward_problem); conv_dgrad, conv_wgrad
// (dbias by GE2's reduction). Compiled only when CMake found cuDNN and the frontend headers
// (GE2_WITH_CUDNN_FRONTEND). Host code only, so it compiles as C++.
//
// Plans per problem, built and timed as _common/cudnn_graph_plans.hpp says. Strict float32 leaves out the engines
// whose numerical notes say tensor cores (TF32); every dtype leaves out those that down-convert inputs or reduce in
// reduced precision, so the convolution accumulates in float32 as the other candidates do.
#include "api.hpp"
#include "cudnn_build.hpp"

#if GE2_WITH_CUDNN_FRONTEND
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cudnn_graph_plans.hpp"
#include "status.hpp"
#endif

namespace ge2::conv2d {

std::string cudnn_graph_not_built_reason() { return cudnn_frontend_not_built_reason(); }

#if !GE2_WITH_CUDNN_FRONTEND

std::string cudnn_graph_unsupported_reason(const Shape&, const Epilogue&, bool) {
  return "not built: " + cudnn_graph_not_built_reason();
}
void cudnn_graph_prepare(const Shape&, const Epilogue&, float, bool, bool) {
  throw std::logic_error("conv2d: built without the cuDNN frontend");
}
std::string scaled_unsupported_reason(const ScaledConv&, int, int) {
  return "not built: " + cudnn_graph_not_built_reason();
}
void scaled_prepare(const ScaledConv&) { throw std::logic_error("scaled_conv2d: built without the cuDNN frontend"); }
void scaled_forward(const ScaledForwardArgs&, cudaStream_t) {
  throw std::logic_error("scaled_conv2d: built without the cuDNN frontend");
}
std::string cudnn_graph_forward(const ForwardArgs&, cudaStream_t) {
  throw std::logic_error("conv2d: built without the cuDNN frontend");
}
std::string cudnn_graph_backward(const BackwardArgs&, cudaStream_t) {
  throw std::logic_error("conv2d: built without the cuDNN frontend");
}

#else

namespace fe = cudnn_graph::fe;
using cudnn_graph::aligned;
using cudnn_graph::execute;
using cudnn_graph::GraphPlan;
using cudnn_graph::GraphPlans;
using cudnn_graph::kMisaligned;
using cudnn_graph::no_engine;
using cudnn_graph::tune;
using cudnn_graph::VariantPack;

namespace {

constexpr const char* kKernel = "cudnn_graph";

enum class Pass : int64_t { Forward, Data, Filter, ScaledForward };

// The graphs' tensors, by uid: the variant pack's keys.
enum Uid : int64_t { kX = 1, kW, kY, kBias, kDy, kDx, kDw, kResidual, kScaleX, kScaleW, kScaleY, kAmax };

fe::DataType_t io_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return fe::DataType_t::FLOAT;
    case DType::Float16: return fe::DataType_t::HALF;
    case DType::BFloat16: return fe::DataType_t::BFLOAT16;
    default: throw std::invalid_argument("dtype: cuDNN takes float32, float16 or bfloat16");
  }
}

// io_type's, and the FP8 types of scaled_conv2d's tensors.
fe::DataType_t tensor_type(DType dtype) {
  switch (dtype) {
    case DType::Float8E4M3: return fe::DataType_t::FP8_E4M3;
    case DType::Float8E5M2: return fe::DataType_t::FP8_E5M2;
    default: return io_type(dtype);
  }
}

// Strides of a tensor of logical dims {N, C, H, W} (filters: {K, C/g, R, S}) stored in `layout` (NHWC filters are
// KRSC, GE2's NHWC weight layout).
std::vector<int64_t> strides_of(Layout layout, const std::vector<int64_t>& dims) {
  const int64_t c = dims[1], h = dims[2], w = dims[3];
  if (layout == Layout::NCHW) return {c * h * w, h * w, w, 1};
  return {h * w * c, 1, w * c, c};
}

// The epilogue's pointwise node; leaky_relu is cuDNN's relu with a lower clip slope.
fe::graph::Pointwise_attributes activation_node(Act act, float slope) {
  auto node = fe::graph::Pointwise_attributes().set_name("act");
  switch (act) {
    case Act::Relu: return node.set_mode(fe::PointwiseMode_t::RELU_FWD);
    case Act::LeakyRelu: return node.set_mode(fe::PointwiseMode_t::RELU_FWD).set_relu_lower_clip_slope(slope);
    case Act::Gelu: return node.set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_FWD);
    case Act::Silu: return node.set_mode(fe::PointwiseMode_t::SWISH_FWD).set_swish_beta(1.0f);
    case Act::Sigmoid: return node.set_mode(fe::PointwiseMode_t::SIGMOID_FWD);
    default: throw std::logic_error("conv2d: cudnn_graph has no node for this activation");
  }
}

int32_t bits_of(float value) {
  int32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

struct Problem {
  Shape shape;
  Pass pass = Pass::Forward;
  Epilogue epilogue;  // forward only: what the graph's pointwise nodes compute
  float slope = 0.0f;
  bool allow_tf32 = false;
  bool float_output = false;  // forward only: y written in float32 (GE2's epilogue kernel then finishes it)

  std::vector<int64_t> key() const {
    const Shape& s = shape;
    const int32_t slope_bits = epilogue.act == Act::LeakyRelu ? bits_of(slope) : 0;  // only leaky_relu reads it
    return {current_device(), s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.p, s.q, s.stride_h, s.stride_w, s.pad_top,
            s.pad_left, s.dilation_h, s.dilation_w, s.groups, static_cast<int64_t>(s.layout),
            static_cast<int64_t>(s.dtype), static_cast<int64_t>(pass), static_cast<int64_t>(epilogue.act), slope_bits,
            epilogue.has_bias, epilogue.has_residual, bits_of(epilogue.clip_low), bits_of(epilogue.clip_high),
            allow_tf32, float_output};
  }
};

// The forward problem of a convolution with `epilogue`, split between the cuDNN graph and GE2's epilogue kernel:
// - float16/bfloat16 where cuDNN's runtime-fusion engines run (NHWC, each group's C and K multiples of 8: groups 1
//   or a ResNeXt-style grouped convolution): the whole epilogue as the graph's pointwise nodes (float32
//   intermediates, y rounded once);
// - float16/bfloat16 elsewhere (NCHW, depthwise, odd channels): the graph writes the convolution in float32 to a
//   scratch buffer and GE2's epilogue kernel rounds y once from it;
// - float32: the graph writes y, GE2's epilogue kernel finishes it in place (float32 is the epilogue's precision).
bool runtime_fusable(const Shape& s) {
  return s.layout == Layout::NHWC && (s.c / s.groups) % 8 == 0 && (s.k / s.groups) % 8 == 0;
}

Problem forward_problem(const Shape& s, const Epilogue& epilogue, float slope, bool allow_tf32) {
  const bool in_graph = s.dtype != DType::Float32 && runtime_fusable(s);
  const bool float_output = s.dtype != DType::Float32 && !in_graph && epilogue.any();
  return {s, Pass::Forward, in_graph ? epilogue : Epilogue{}, slope, allow_tf32, float_output};
}

// Backward passes take no epilogue: act is none there (dbias is GE2's reduction of dy).
Problem backward_problem(const Shape& shape, Pass pass, bool allow_tf32) {
  return {shape, pass, Epilogue{}, 0.0f, allow_tf32, false};
}

// The clip after the activation: cuDNN's RELU_FWD between a lower and an upper clip (an absent bound: the float
// range's end, which clips nothing finite).
fe::graph::Pointwise_attributes clip_node(const Epilogue& epilogue) {
  const float largest = std::numeric_limits<float>::max();
  return fe::graph::Pointwise_attributes().set_name("clip").set_mode(fe::PointwiseMode_t::RELU_FWD)
      .set_relu_lower_clip(std::max(epilogue.clip_low, -largest))
      .set_relu_upper_clip(std::min(epilogue.clip_high, largest))
      .set_relu_lower_clip_slope(0.0f);
}

// The bottom (right) padding, which Shape does not keep: the top (left) one where that gives the same output size, so
// that a symmetric problem stays symmetric for cuDNN, else the least that does (the rest is never read).
int64_t trailing_padding(int64_t size, int64_t leading, int64_t outputs, int64_t stride, int64_t dilation,
                         int64_t taps) {
  const int64_t extent = dilation * (taps - 1) + 1;
  if (size + 2 * leading >= extent && (size + 2 * leading - extent) / stride + 1 == outputs) return leading;
  return std::max<int64_t>(0, (outputs - 1) * stride + extent - size - leading);
}

// The convolution's window as the frontend's attributes take it.
struct Window {
  std::vector<int64_t> pre, post, stride, dilation;
};

Window window_of(const Shape& s) {
  const int64_t pad_bottom = trailing_padding(s.h, s.pad_top, s.p, s.stride_h, s.dilation_h, s.r);
  const int64_t pad_right = trailing_padding(s.w, s.pad_left, s.q, s.stride_w, s.dilation_w, s.s);
  return {{s.pad_top, s.pad_left}, {pad_bottom, pad_right}, {s.stride_h, s.stride_w}, {s.dilation_h, s.dilation_w}};
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// y = clip(act(y + bias + residual)) as pointwise nodes (float32 intermediates); the bias and the residual of types
// `bias_type` and `residual_type`, the residual in y's dims and layout.
TensorPtr add_epilogue(fe::graph::Graph& graph, TensorPtr y, const Shape& s, const Epilogue& epilogue, float slope,
                       fe::DataType_t bias_type, fe::DataType_t residual_type) {
  if (epilogue.has_bias) {
    auto bias = graph.tensor(fe::graph::Tensor_attributes().set_name("bias").set_uid(kBias).set_dim({1, s.k, 1, 1})
                                 .set_stride({s.k, 1, 1, 1}).set_data_type(bias_type));
    y = graph.pointwise(y, bias, fe::graph::Pointwise_attributes().set_name("bias_add").set_mode(
                                     fe::PointwiseMode_t::ADD));
  }
  if (epilogue.has_residual) {
    const std::vector<int64_t> y_dims = {s.n, s.k, s.p, s.q};
    auto residual = graph.tensor(fe::graph::Tensor_attributes().set_name("residual").set_uid(kResidual)
                                     .set_dim(y_dims).set_stride(strides_of(s.layout, y_dims))
                                     .set_data_type(residual_type));
    y = graph.pointwise(y, residual, fe::graph::Pointwise_attributes().set_name("residual_add").set_mode(
                                         fe::PointwiseMode_t::ADD));
  }
  if (epilogue.act != Act::None) y = graph.pointwise(y, activation_node(epilogue.act, slope));
  if (epilogue.has_clip()) y = graph.pointwise(y, clip_node(epilogue));
  return y;
}

// The tensors and the convolution node of `problem` in `graph`.
void add_nodes(fe::graph::Graph& graph, const Problem& problem) {
  const Shape& s = problem.shape;
  const fe::DataType_t io = io_type(s.dtype);
  graph.set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
      fe::DataType_t::FLOAT);
  const std::vector<int64_t> x_dims = {s.n, s.c, s.h, s.w}, w_dims = {s.k, s.c / s.groups, s.r, s.s},
                             y_dims = {s.n, s.k, s.p, s.q};
  auto tensor = [&](Uid uid, const char* name, const std::vector<int64_t>& dims) {
    return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
        strides_of(s.layout, dims)));
  };
  auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid,
                    const std::vector<int64_t>& dims, fe::DataType_t type) {
    t->set_output(true).set_uid(uid).set_dim(dims).set_stride(strides_of(s.layout, dims)).set_data_type(type);
  };
  const Window window = window_of(s);
  switch (problem.pass) {
    case Pass::Forward: {
      auto y = graph.conv_fprop(tensor(kX, "x", x_dims), tensor(kW, "w", w_dims),
                                fe::graph::Conv_fprop_attributes().set_name("conv").set_pre_padding(window.pre)
                                    .set_post_padding(window.post).set_stride(window.stride)
                                    .set_dilation(window.dilation));
      y = add_epilogue(graph, y, s, problem.epilogue, problem.slope, io, io);
      output(y, kY, y_dims, problem.float_output ? fe::DataType_t::FLOAT : io);
      return;
    }
    case Pass::Data: {
      auto dx = graph.conv_dgrad(tensor(kDy, "dy", y_dims), tensor(kW, "w", w_dims),
                                 fe::graph::Conv_dgrad_attributes().set_name("dgrad").set_pre_padding(window.pre)
                                     .set_post_padding(window.post).set_stride(window.stride)
                                     .set_dilation(window.dilation));
      output(dx, kDx, x_dims, io);
      return;
    }
    case Pass::Filter: {
      auto dw = graph.conv_wgrad(tensor(kDy, "dy", y_dims), tensor(kX, "x", x_dims),
                                 fe::graph::Conv_wgrad_attributes().set_name("wgrad").set_pre_padding(window.pre)
                                     .set_post_padding(window.post).set_stride(window.stride)
                                     .set_dilation(window.dilation));
      output(dw, kDw, w_dims, io);
      return;
    }
    case Pass::ScaledForward: throw std::logic_error("conv2d: scaled_conv2d's graph is add_scaled_nodes'");
  }
}

// Strict float32 leaves out TF32 engines (FFT and Winograd ones compute in float32 and stay, as with PyTorch's TF32
// off); every dtype the reduced-precision ones.
std::vector<fe::NumericalNote_t> excluded_notes(const Problem& problem) {
  std::vector<fe::NumericalNote_t> excluded = {fe::NumericalNote_t::DOWN_CONVERT_INPUTS,
                                               fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION};
  if (problem.shape.dtype == DType::Float32 && !problem.allow_tf32) {
    excluded.push_back(fe::NumericalNote_t::TENSOR_CORE);
  }
  return excluded;
}

// The cached plans of `problem` (see GraphPlans::plan_for); the caller holds the handle lock.
GraphPlan& plan_for(const Problem& problem, cudnnHandle_t handle, cudaStream_t stream, bool on_stream) {
  return GraphPlans::instance().plan_for(
      problem.key(), [&problem](fe::graph::Graph& graph) { add_nodes(graph, problem); }, excluded_notes(problem),
      handle, stream, on_stream, kKernel);
}

}  // namespace


std::string cudnn_graph_unsupported_reason(const Shape& s, const Epilogue& epilogue, bool backward) {
  if (backward && epilogue.act != Act::None) {
    return "activation gradients (dz = dy * act'(z) with z recomputed) run in im2col_gemm";
  }
  if (!backward && epilogue.any() && forward_problem(s, epilogue, 0.0f, false).float_output &&
      implicit_gemm_unsupported_reason(s, false).empty()) {
    // Outside cuDNN's runtime fusion the graph writes float32 and a second kernel finishes y; GE2's implicit GEMM
    // fuses the epilogue in one.
    return "implicit_gemm fuses this epilogue in one kernel (cuDNN's runtime fusion needs C and K multiples of 8)";
  }
  if (!backward && epilogue.any() && forward_problem(s, epilogue, 0.0f, false).float_output && s.groups > 1) {
    // cuDNN answers INVALID_DATA_CONFIG for every engine (EfficientNet-B0's 16 depthwise convolutions on the H200),
    // after building and trying its whole fallback list: 74 of the cold plan build's 75 s (GPU call 1, session 31)
    return "cuDNN has no engine for a grouped 16-bit convolution writing float32 (an invalid data config outside "
           "its runtime fusion, which needs each group's C and K multiples of 8): depthwise runs on depthwise, the "
           "rest on im2col_gemm";
  }
  if (backward && (trailing_padding(s.h, s.pad_top, s.p, s.stride_h, s.dilation_h, s.r) != s.pad_top ||
                   trailing_padding(s.w, s.pad_left, s.q, s.stride_w, s.dilation_w, s.s) != s.pad_left)) {
    // compute-sanitizer on the H100: cuDNN's wgrad_alg0_engine read up to 16 bytes past dy's end with pre-padding
    // 2, post-padding 0 (cuDNN 9 of PyTorch 2.11's wheel).
    return "uneven padding in backward: a cuDNN weight-gradient engine reads past the end of dy there";
  }
  constexpr int64_t kMaxElements = (int64_t{1} << 31) - 1;  // cuDNN's kernels index in int32
  if (s.n * s.c * s.h * s.w > kMaxElements || s.n * s.k * s.p * s.q > kMaxElements ||
      s.k * (s.c / s.groups) * s.r * s.s > kMaxElements) {
    return "a tensor has more than 2^31 - 1 elements";
  }
  return "";
}

void cudnn_graph_prepare(const Shape& shape, const Epilogue& epilogue, float slope, bool allow_tf32, bool backward) {
  const std::vector<Problem> problems =
      backward ? std::vector<Problem>{backward_problem(shape, Pass::Data, allow_tf32),
                                      backward_problem(shape, Pass::Filter, allow_tf32)}
               : std::vector<Problem>{forward_problem(shape, epilogue, slope, allow_tf32)};
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  cudnnHandle_t handle = CudnnHandles::instance().current();
  for (const Problem& problem : problems) {
    const GraphPlan& plan = plan_for(problem, handle, nullptr, /*on_stream=*/false);
    if (plan.graph == nullptr) throw std::runtime_error(cudnn_graph::kernel_prefix(kKernel) + no_engine(plan));
  }
}

std::string cudnn_graph_forward(const ForwardArgs& args, cudaStream_t stream) {
  if (!aligned({args.x, args.w, args.bias, args.residual, args.y})) return kMisaligned;
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  cudnnHandle_t handle = CudnnHandles::instance().bound_to(stream);
  const Epilogue epilogue = epilogue_of(args);
  const Problem problem = forward_problem(args.shape, epilogue, args.slope, args.allow_tf32);
  GraphPlan& plan = plan_for(problem, handle, stream, /*on_stream=*/true);
  if (plan.graph == nullptr) return no_engine(plan);
  const Shape& s = args.shape;
  const std::size_t float_y_bytes =
      problem.float_output ? static_cast<std::size_t>(s.n * s.k * s.p * s.q) * sizeof(float) : 0;
  VariantPack pack = {{kX, const_cast<void*>(args.x)}, {kW, const_cast<void*>(args.w)}, {kY, args.y}};
  if (problem.epilogue.has_bias) pack[kBias] = const_cast<void*>(args.bias);
  if (problem.epilogue.has_residual) pack[kResidual] = const_cast<void*>(args.residual);
  if (!plan.tuned && problem.float_output) {
    // Timed on a float32 y of its own (the stream workspace holds the timing's scratch), once, outside capture.
    void* timing_y = nullptr;
    GE2_CUDA_CHECK(cudaMallocAsync(&timing_y, float_y_bytes, stream));
    pack[kY] = timing_y;
    tune(plan, handle, pack, stream, kKernel);
    GE2_CUDA_CHECK(cudaFreeAsync(timing_y, stream));
  }
  tune(plan, handle, pack, stream, kKernel);
  // One stream workspace: the plan's scratch, then (float32 output) the convolution in float32.
  const std::size_t plan_bytes = (static_cast<std::size_t>(plan.workspace) + 255) / 256 * 256;
  char* scratch = plan_bytes + float_y_bytes > 0
                      ? static_cast<char*>(StreamWorkspace::get(plan_bytes + float_y_bytes, stream))
                      : nullptr;
  float* float_y = problem.float_output ? reinterpret_cast<float*>(scratch + plan_bytes) : nullptr;
  if (float_y != nullptr) pack[kY] = float_y;
  execute(plan, handle, pack, plan.workspace > 0 ? scratch : nullptr, kKernel);
  if (problem.float_output) {  // y = clip(act(conv + bias + residual)), rounded once from the float32 convolution
    launch_epilogue(args, float_y, /*acc_in_y_layout=*/true, stream);
  } else if (epilogue.any() && !problem.epilogue.any()) {  // float32: the same, in place
    launch_epilogue(args, static_cast<const float*>(args.y), /*acc_in_y_layout=*/true, stream);
  }
  return "";
}

std::string cudnn_graph_backward(const BackwardArgs& args, cudaStream_t stream) {
  if (!aligned({args.dy, args.x, args.w, args.dx, args.dw})) return kMisaligned;  // dbias: GE2's reduction
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  cudnnHandle_t handle = CudnnHandles::instance().bound_to(stream);
  GraphPlan* data = nullptr;
  GraphPlan* filter = nullptr;
  if (args.dx != nullptr) {
    data = &plan_for(backward_problem(args.shape, Pass::Data, args.allow_tf32), handle, stream, /*on_stream=*/true);
    if (data->graph == nullptr) return no_engine(*data);
  }
  if (args.dw != nullptr) {
    filter = &plan_for(backward_problem(args.shape, Pass::Filter, args.allow_tf32), handle, stream,
                       /*on_stream=*/true);
    if (filter->graph == nullptr) return no_engine(*filter);
  }
  VariantPack data_pack = {{kDy, const_cast<void*>(args.dy)}, {kW, const_cast<void*>(args.w)},
                                                  {kDx, args.dx}};
  VariantPack filter_pack = {{kDy, const_cast<void*>(args.dy)},
                                                    {kX, const_cast<void*>(args.x)}, {kDw, args.dw}};
  if (data != nullptr) tune(*data, handle, data_pack, stream, kKernel);
  if (filter != nullptr) tune(*filter, handle, filter_pack, stream, kKernel);
  // One workspace for both passes: growing it between them would wait for the stream.
  const int64_t bytes = std::max(data != nullptr ? data->workspace : 0, filter != nullptr ? filter->workspace : 0);
  void* workspace = bytes > 0 ? StreamWorkspace::get(static_cast<std::size_t>(bytes), stream) : nullptr;
  if (data != nullptr) execute(*data, handle, data_pack, workspace, kKernel);
  if (filter != nullptr) execute(*filter, handle, filter_pack, workspace, kKernel);
  // act is none here, so dbias is the sum of dy: the reduction im2col_gemm uses, one dbias path for every dtype.
  if (args.dbias != nullptr) launch_bias_grad(args.shape, args.dy, args.dbias, /*gemm_layout=*/false, stream);
  return "";
}

// ---- scaled_conv2d: FP8 x and w ---------------------------------------------------------------------------------
// One graph: conv_fprop on the FP8 tensors (products exact, float32 accumulation), the dequantization as two
// pointwise multiplies by the device scalars scale_x and scale_w, the epilogue's nodes (float32), then an FP8 y's
// AMAX reduction and its multiply by scale_y before the cast (cuDNN's FP8 fprop sample's graph). No engine is left
// out by its numerical notes: an FP8 convolution is reduced precision by design, and its inputs are already FP8.
namespace {

constexpr const char* kFp8Kernel = "cudnn_graph_fp8";

std::vector<int64_t> scaled_key(const ScaledConv& conv) {
  std::vector<int64_t> key =
      Problem{conv.shape, Pass::ScaledForward, conv.epilogue, conv.slope, false, false}.key();
  key.insert(key.end(), {static_cast<int64_t>(conv.x_dtype), static_cast<int64_t>(conv.w_dtype),
                         conv.epilogue.has_bias ? static_cast<int64_t>(conv.bias_dtype) : -1, conv.with_amax});
  return key;
}

void add_scaled_nodes(fe::graph::Graph& graph, const ScaledConv& conv) {
  const Shape& s = conv.shape;
  const bool fp8_y = is_float8(s.dtype);
  graph.set_io_data_type(fp8_y ? fe::DataType_t::BFLOAT16 : io_type(s.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> x_dims = {s.n, s.c, s.h, s.w}, w_dims = {s.k, s.c, s.r, s.s},
                             y_dims = {s.n, s.k, s.p, s.q};
  auto tensor = [&](Uid uid, const char* name, const std::vector<int64_t>& dims, DType dtype) {
    return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims)
                            .set_stride(strides_of(Layout::NHWC, dims)).set_data_type(tensor_type(dtype)));
  };
  auto scalar = [&](Uid uid, const char* name) {
    return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({1, 1, 1, 1})
                            .set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::FLOAT));
  };
  auto multiply = [](const char* name) {
    return fe::graph::Pointwise_attributes().set_name(name).set_mode(fe::PointwiseMode_t::MUL);
  };
  const Window window = window_of(s);
  auto z = graph.conv_fprop(tensor(kX, "x", x_dims, conv.x_dtype), tensor(kW, "w", w_dims, conv.w_dtype),
                            fe::graph::Conv_fprop_attributes().set_name("conv").set_pre_padding(window.pre)
                                .set_post_padding(window.post).set_stride(window.stride)
                                .set_dilation(window.dilation));
  z = graph.pointwise(z, scalar(kScaleX, "scale_x"), multiply("descale_x"));
  z = graph.pointwise(z, scalar(kScaleW, "scale_w"), multiply("descale_w"));
  z = add_epilogue(graph, z, s, conv.epilogue, conv.slope, tensor_type(conv.bias_dtype), tensor_type(s.dtype));
  if (conv.with_amax) {
    auto amax = graph.reduction(z, fe::graph::Reduction_attributes().set_name("amax").set_mode(
                                       fe::ReductionMode_t::AMAX).set_compute_data_type(fe::DataType_t::FLOAT));
    amax->set_output(true).set_uid(kAmax).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
  }
  if (fp8_y) z = graph.pointwise(z, scalar(kScaleY, "scale_y"), multiply("scale_y"));
  z->set_output(true).set_uid(kY).set_dim(y_dims).set_stride(strides_of(Layout::NHWC, y_dims)).set_data_type(
      tensor_type(s.dtype));
}

GraphPlan& scaled_plan_for(const ScaledConv& conv, cudnnHandle_t handle, cudaStream_t stream, bool on_stream) {
  return GraphPlans::instance().plan_for(
      scaled_key(conv), [&conv](fe::graph::Graph& graph) { add_scaled_nodes(graph, conv); }, {}, handle, stream,
      on_stream, kFp8Kernel);
}

// scaled_unsupported_reason without the architecture: what the arguments themselves break.
std::string scaled_problem_reason(const ScaledConv& conv) {
  const Shape& s = conv.shape;
  const bool fp8_y = is_float8(s.dtype);
  if (s.layout != Layout::NHWC) return "NHWC only (x [N, H, W, C], w [K, R, S, C])";
  if (s.groups != 1) return "groups 1 only, got " + std::to_string(s.groups);
  if (!is_float8(conv.x_dtype) || !is_float8(conv.w_dtype)) {
    return std::string("x and w must be float8_e4m3fn or float8_e5m2, got ") + dtype_name(conv.x_dtype) + " and " +
           dtype_name(conv.w_dtype);
  }
  if (s.dtype != DType::Float16 && s.dtype != DType::BFloat16 && !fp8_y) {
    return std::string("out_dtype must be float16, bfloat16 or an FP8 dtype, got ") + dtype_name(s.dtype);
  }
  if (s.c % 16 != 0 || s.k % 16 != 0) {
    return "C=" + std::to_string(s.c) + " and K=" + std::to_string(s.k) +
           " must be multiples of 16 (FP8 channels in 16-byte vectors)";
  }
  const DType bias_dtype = fp8_y ? DType::BFloat16 : s.dtype;
  if (conv.epilogue.has_bias && conv.bias_dtype != bias_dtype) {
    return std::string("bias must be ") + dtype_name(bias_dtype) + " with a " + dtype_name(s.dtype) +
           " output, got " + dtype_name(conv.bias_dtype);
  }
  const Act act = conv.epilogue.act;
  if (act != Act::None && act != Act::Relu && act != Act::LeakyRelu && act != Act::Gelu && act != Act::Silu) {
    return "act must be none, relu, leaky_relu, gelu or silu (cuDNN's pointwise nodes)";
  }
  if (conv.epilogue.has_residual && fp8_y) return "a residual only with a 16-bit output";
  if (conv.with_amax && !fp8_y) return "the amax only with an FP8 output (cuDNN's AMAX reduction before scale_y)";
  constexpr int64_t kMaxElements = (int64_t{1} << 31) - 1;  // cuDNN's kernels index in int32
  if (s.n * s.c * s.h * s.w > kMaxElements || s.n * s.k * s.p * s.q > kMaxElements ||
      s.k * s.c * s.r * s.s > kMaxElements) {
    return "a tensor has more than 2^31 - 1 elements";
  }
  return "";
}

void check_scaled_shape(const Shape& shape) {
  Shape sizes = shape;
  sizes.dtype = DType::Float32;  // check_shape's sizes and window; the dtypes are scaled_problem_reason's
  check_shape(sizes);
}

}  // namespace

std::string scaled_unsupported_reason(const ScaledConv& conv, int major, int minor) {
  if (major * 10 + minor < 89) {
    return "FP8 tensor cores need sm_89 or newer, got sm_" + std::to_string(major) + std::to_string(minor);
  }
  return scaled_problem_reason(conv);
}

void scaled_prepare(const ScaledConv& conv) {
  check_scaled_shape(conv.shape);
  const std::string reason = scaled_problem_reason(conv);
  if (!reason.empty()) throw std::invalid_argument("kernel: 'cudnn_graph_fp8' cannot run this problem: " + reason);
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  const GraphPlan& plan = scaled_plan_for(conv, CudnnHandles::instance().current(), nullptr, /*on_stream=*/false);
  if (plan.graph == nullptr) throw std::runtime_error(cudnn_graph::kernel_prefix(kFp8Kernel) + no_engine(plan));
}

void scaled_forward(const ScaledForwardArgs& args, cudaStream_t stream) {
  const ScaledConv& conv = args.conv;
  check_scaled_shape(conv.shape);
  const std::string reason = scaled_problem_reason(conv);
  if (!reason.empty()) throw std::invalid_argument("kernel: 'cudnn_graph_fp8' cannot run this problem: " + reason);
  const std::pair<const void*, const char*> required[] = {
      {args.x, "x"}, {args.w, "w"}, {args.scale_x, "scale_x"}, {args.scale_w, "scale_w"}, {args.y, "y"}};
  for (const auto& [pointer, name] : required) {
    if (pointer == nullptr) throw std::invalid_argument(std::string(name) + ": null device pointer");
  }
  if (conv.epilogue.has_bias != (args.bias != nullptr)) {
    throw std::invalid_argument("bias: a pointer exactly when the problem has a bias");
  }
  if (conv.epilogue.has_residual != (args.residual != nullptr)) {
    throw std::invalid_argument("residual: a pointer exactly when the problem has a residual");
  }
  if (is_float8(conv.shape.dtype) && args.scale_y == nullptr) {
    throw std::invalid_argument("scale_y: an FP8 output needs its scale (a float32 device scalar)");
  }
  if (conv.with_amax && args.amax == nullptr) throw std::invalid_argument("amax: null device pointer");
  if (!aligned({args.x, args.w, args.bias, args.residual, args.y})) {
    throw std::invalid_argument("x, w, bias, residual, y: kernel 'cudnn_graph_fp8' " + std::string(kMisaligned));
  }
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  cudnnHandle_t handle = CudnnHandles::instance().bound_to(stream);
  GraphPlan& plan = scaled_plan_for(conv, handle, stream, /*on_stream=*/true);
  if (plan.graph == nullptr) throw std::runtime_error(cudnn_graph::kernel_prefix(kFp8Kernel) + no_engine(plan));
  VariantPack pack = {{kX, const_cast<void*>(args.x)},
                      {kW, const_cast<void*>(args.w)},
                      {kScaleX, const_cast<float*>(args.scale_x)},
                      {kScaleW, const_cast<float*>(args.scale_w)},
                      {kY, args.y}};
  if (conv.epilogue.has_bias) pack[kBias] = const_cast<void*>(args.bias);
  if (conv.epilogue.has_residual) pack[kResidual] = const_cast<void*>(args.residual);
  if (is_float8(conv.shape.dtype)) pack[kScaleY] = const_cast<float*>(args.scale_y);
  if (conv.with_amax) pack[kAmax] = args.amax;
  tune(plan, handle, pack, stream, kFp8Kernel);
  void* workspace =
      plan.workspace > 0 ? StreamWorkspace::get(static_cast<std::size_t>(plan.workspace), stream) : nullptr;
  execute(plan, handle, pack, workspace, kFp8Kernel);
}

#endif

}  // namespace ge2::conv2d
