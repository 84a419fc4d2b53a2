// cudnn: cuDNN's legacy convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter; dbias by GE2),
// compiled only when CMake found cuDNN (GE2_WITH_CUDNN). The algorithm of each problem is chosen once by
// cudnnFind*Algorithm (cuDNN times its candidates, as PyTorch's cudnn.benchmark does) and cached.
#include "api.hpp"

#if GE2_WITH_CUDNN
#include <array>
#include <map>
#include <memory>
#include <mutex>

#include "cudnn_handle.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"
#endif

namespace ge2::conv2d {

#if !GE2_WITH_CUDNN

std::string cudnn_unsupported_reason(const Shape&, const Epilogue&, bool) {
  return "this build of _ops_conv2d has no cuDNN (CMake found no cudnn.h and libcudnn: neither in the CUDA toolkit "
         "nor in the nvidia-cudnn-cu13 Python package)";
}
bool cudnn_forward(const ForwardArgs&, cudaStream_t) { throw std::logic_error("conv2d: built without cuDNN"); }
bool cudnn_backward(const BackwardArgs&, cudaStream_t) { throw std::logic_error("conv2d: built without cuDNN"); }

#else

namespace {

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: throw std::invalid_argument("dtype: cuDNN takes float32, float16 or bfloat16");
  }
}

// Descriptors of one problem and the algorithms cuDNN found fastest for it (found on first use, then kept).
struct CudnnPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t baseline_math = CUDNN_DEFAULT_MATH;  // what every Find starts from (strict fp32: FMA only)
  // Searched: cudnnFind* has run (found: it returned a working algorithm).
  bool searched_forward = false, searched_data = false, searched_filter = false;
  bool found_forward = false, found_data = false, found_filter = false;
  cudnnConvolutionFwdAlgoPerf_t forward{};
  cudnnConvolutionBwdDataAlgoPerf_t data{};
  cudnnConvolutionBwdFilterAlgoPerf_t filter{};

  ~CudnnPlan() {
    for (auto tensor : {x, y}) {
      if (tensor) cudnnDestroyTensorDescriptor(tensor);
    }
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

using CudnnKey = std::array<int64_t, 20>;

struct CudnnPlans {
  std::mutex mutex;
  std::map<CudnnKey, std::unique_ptr<CudnnPlan>> plans;

  static CudnnPlans& instance() {
    static auto* plans = new CudnnPlans();  // never destroyed: outlives Python's teardown order
    return *plans;
  }
};

int as_int(int64_t value) { return static_cast<int>(value); }

CudnnPlan* plan_for(const Shape& s, bool allow_tf32) {
  const int device = current_device();
  const CudnnKey key = {device, s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.stride_h, s.stride_w, s.pad_top, s.pad_left,
                        s.dilation_h, s.dilation_w, s.groups, static_cast<int64_t>(s.layout),
                        static_cast<int64_t>(s.dtype), allow_tf32, 0, 0};
  auto& cache = CudnnPlans::instance();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto found = cache.plans.find(key);
  if (found != cache.plans.end()) return found->second.get();
  auto plan = std::make_unique<CudnnPlan>();
  const cudnnTensorFormat_t format = s.layout == Layout::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  const cudnnDataType_t type = cudnn_type(s.dtype);
  GE2_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  GE2_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  GE2_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  GE2_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  GE2_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x, format, type, as_int(s.n), as_int(s.c), as_int(s.h),
                                             as_int(s.w)));
  GE2_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y, format, type, as_int(s.n), as_int(s.k), as_int(s.p),
                                             as_int(s.q)));
  // NHWC filters are [K, R, S, C/g] (KRSC), exactly GE2's NHWC weight layout.
  GE2_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, type, format, as_int(s.k), as_int(s.c / s.groups),
                                             as_int(s.r), as_int(s.s)));
  GE2_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, as_int(s.pad_top), as_int(s.pad_left),
                                                  as_int(s.stride_h), as_int(s.stride_w), as_int(s.dilation_h),
                                                  as_int(s.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  GE2_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan->conv, as_int(s.groups)));
  // float32 stays strict fp32 (FMA math) unless TF32 is asked for; 16-bit types use tensor cores.
  const bool fma_only = s.dtype == DType::Float32 && !allow_tf32;
  plan->baseline_math = fma_only ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
  CudnnPlan* raw = plan.get();
  cache.plans.emplace(key, std::move(plan));
  return raw;
}

// Strict float32 takes FMA math only (CUDNN_DEFAULT_MATH lets Ampere+ use TF32). The FFT and non-fused Winograd
// algorithms stay: they compute in float32, as PyTorch's cuDNN with TF32 off runs them (see the README's precision
// note).
bool precise(cudnnMathType_t math) { return math == CUDNN_FMA_MATH; }

// 16-bit data takes deterministic algorithms only. The others (BackwardData's ALGO_0, BackwardFilter's ALGO_0 and
// ALGO_3) add partial sums into the output with atomics, so each partial sum is rounded to the 16-bit type. A float16
// 3x3 layer's dx failed its test when cudnnFind timed BackwardData's ALGO_0 (no workspace) fastest, as cuDNN's API log
// showed in session 42 (session 41: 18 of 100352 elements out of tolerance, 0.025 off at an element of 0.37). float32
// keeps them, as PyTorch's cudnn.benchmark does: float32 atomics round far below its tolerance.
//
// One direction's algorithm, searched once per plan: `find(requested, &returned, results)` runs the direction's
// cudnnFind* (refused during capture: it allocates and synchronizes). `chosen` takes the first result that ran
// (cuDNN sorts them fastest first), keeps strict float32 precise and 16-bit data deterministic, and on tensor cores
// where such a result ran; `found` says whether one did.
template <typename Perf, typename Find>
void search_once(CudnnPlan& plan, DType dtype, cudaStream_t stream, bool& searched, bool& found, Perf& chosen,
                 Find find) {
  if (searched) return;
  refuse_cudnn_setup_during_capture(stream, "cudnn", "choose its algorithm");
  GE2_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, plan.baseline_math));
  constexpr int kRequested = 8;
  Perf results[kRequested];
  int returned = 0;
  // A process's first search can time a slow algorithm first: session 42's float16 NHWC C512 H28 K128 1x1 forward
  // took IMPLICIT_GEMM without tensor cores (0.158 ms in graph replay, PyTorch 0.009 ms), with CUDA's lazy kernel
  // loading on or off. A second search, after every algorithm has run once, took IMPLICIT_PRECOMP_GEMM on tensor
  // cores (0.009 ms). The first search warms up; the second is kept (once per problem and direction).
  find(kRequested, &returned, results);
  find(kRequested, &returned, results);
  const bool strict_fp32 = plan.baseline_math == CUDNN_FMA_MATH, sixteen_bit = dtype != DType::Float32;
  const auto eligible = [&](const Perf& result) {
    return result.status == CUDNN_STATUS_SUCCESS && (!strict_fp32 || precise(result.mathType)) &&
           (!sixteen_bit || result.determinism == CUDNN_DETERMINISTIC);
  };
  // 16-bit data takes the fastest tensor-op algorithm when one ran, else the fastest eligible one. cudnnFind's
  // ranking of the small 1x1 layers is unstable: after the double search, session 44's two processes still ran
  // float16 C64 H56 K64 and C512 H28 K128 forwards at 0.054-0.105x PyTorch in both layouts (session 42's log:
  // IMPLICIT_GEMM without tensor cores, timed fastest). With this preference every ResNet-50 row ran at 0.95-1.23x.
  const auto tensor_op = [](cudnnMathType_t math) {
    return math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  };
  found = false;
  for (const bool tensor_op_only : {sixteen_bit, false}) {
    for (int i = 0; i < returned && !found; ++i) {
      found = eligible(results[i]) && (!tensor_op_only || tensor_op(results[i].mathType));
      if (found) chosen = results[i];
    }
  }
  searched = true;
}

}  // namespace

std::string cudnn_unsupported_reason(const Shape& s, const Epilogue& epilogue, bool backward) {
  if (backward && epilogue.act != Act::None) {
    return "activation gradients (dz = dy * act'(z) with z recomputed) run in im2col_gemm";
  }
  if (!backward && epilogue.any() && s.dtype != DType::Float32) {
    // float32 output is the epilogue's own precision, so a second kernel over y rounds nothing; a 16-bit y would
    // be rounded before the bias. cudnn_graph and implicit_gemm fuse the epilogue for 16-bit types.
    return "a 16-bit epilogue (bias, residual, activation, clip) after cuDNN would round the convolution first; "
           "cudnn_graph and implicit_gemm fuse it in float32";
  }
  // cuDNN pads symmetrically: the output size must come out the same with bottom = top and right = left.
  const int64_t p = (s.h + 2 * s.pad_top - s.dilation_h * (s.r - 1) - 1) / s.stride_h + 1;
  const int64_t q = (s.w + 2 * s.pad_left - s.dilation_w * (s.s - 1) - 1) / s.stride_w + 1;
  if (p != s.p || q != s.q) return "cuDNN takes symmetric padding only (top == bottom, left == right)";
  constexpr int64_t kMaxElements = (int64_t{1} << 31) - 1;  // 4-d descriptors count in int
  if (s.n * s.c * s.h * s.w > kMaxElements || s.n * s.k * s.p * s.q > kMaxElements) {
    return "a tensor has more than 2^31 - 1 elements";
  }
  return "";
}

// cudnnFind* allocates its own scratch and synchronizes, so it is refused during capture.
bool cudnn_forward(const ForwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  CudnnPlan* plan = plan_for(s, args.allow_tf32);
  cudnnHandle_t handle = CudnnHandles::instance().bound_to(stream);
  search_once(*plan, s.dtype, stream, plan->searched_forward, plan->found_forward, plan->forward,
              [&](int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
                GE2_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(handle, plan->x, plan->w, plan->conv, plan->y,
                                                                     requested, returned, results));
              });
  if (!plan->found_forward) return false;
  void* workspace = plan->forward.memory > 0 ? StreamWorkspace::get(plan->forward.memory, stream) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  GE2_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, plan->forward.mathType));
  GE2_CUDNN_CHECK(cudnnConvolutionForward(handle, &alpha, plan->x, args.x, plan->w, args.w, plan->conv,
                                          plan->forward.algo, workspace, plan->forward.memory, &beta, plan->y,
                                          args.y));
  if (epilogue_of(args).any()) {  // float32 only (cudnn_unsupported_reason): y = clip(act(y + bias + residual))
    launch_epilogue(args, static_cast<const float*>(args.y), /*acc_in_y_layout=*/true, stream);
  }
  return true;
}

bool cudnn_backward(const BackwardArgs& args, cudaStream_t stream) {
  const Shape& s = args.shape;
  std::lock_guard<std::mutex> lock(CudnnHandles::instance().call_mutex());
  CudnnPlan* plan = plan_for(s, args.allow_tf32);
  cudnnHandle_t handle = CudnnHandles::instance().bound_to(stream);
  if (args.dx != nullptr) {
    search_once(*plan, s.dtype, stream, plan->searched_data, plan->found_data, plan->data,
                [&](int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
                  GE2_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(handle, plan->w, plan->y, plan->conv,
                                                                            plan->x, requested, returned, results));
                });
  }
  if (args.dw != nullptr) {
    search_once(*plan, s.dtype, stream, plan->searched_filter, plan->found_filter, plan->filter,
                [&](int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results) {
                  GE2_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(handle, plan->x, plan->y, plan->conv,
                                                                              plan->w, requested, returned, results));
                });
  }
  if ((args.dx != nullptr && !plan->found_data) || (args.dw != nullptr && !plan->found_filter)) return false;
  // One workspace for both calls: growing it between them would wait for the stream.
  std::size_t bytes = 0;
  if (args.dx != nullptr) bytes = std::max(bytes, plan->data.memory);
  if (args.dw != nullptr) bytes = std::max(bytes, plan->filter.memory);
  void* workspace = bytes > 0 ? StreamWorkspace::get(bytes, stream) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  if (args.dx != nullptr) {
    GE2_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, plan->data.mathType));
    GE2_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &alpha, plan->w, args.w, plan->y, args.dy, plan->conv,
                                                 plan->data.algo, workspace, plan->data.memory, &beta, plan->x,
                                                 args.dx));
  }
  if (args.dw != nullptr) {
    GE2_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, plan->filter.mathType));
    GE2_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &alpha, plan->x, args.x, plan->y, args.dy, plan->conv,
                                                   plan->filter.algo, workspace, plan->filter.memory, &beta,
                                                   plan->w, args.dw));
  }
  // act is none here, so dbias is the sum of dy: the reduction im2col_gemm uses, one dbias path for every dtype.
  if (args.dbias != nullptr) launch_bias_grad(s, args.dy, args.dbias, /*gemm_layout=*/false, stream);
  return true;
}

#endif

}  // namespace ge2::conv2d
