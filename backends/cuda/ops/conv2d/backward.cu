// conv2d backward on the named kernel (the Python selector chooses): cudnn_graph or cudnn (std::runtime_error when
// cuDNN has no engine or algorithm for the problem), cutlass_sm90 (kernels/cutlass_sm90.cu), or im2col_gemm:
// dz = dy * act'(z) (z recomputed by the forward GEMM when act != none), dbias by a reduction of dz,
// dW = dz @ col^T and dX = col2im(W^T @ dz) per group.
#include "api.hpp"
#include "batched_gemm.hpp"
#include "status.hpp"
#include "stream_workspace.hpp"

namespace ge2::conv2d {
namespace {

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Enqueues the backward on a cuDNN kernel: empty when it did, else why it declined (enqueuing nothing).
std::string try_cudnn_backward(Kernel kernel, const BackwardArgs& args, cudaStream_t stream) {
  if (kernel == Kernel::CudnnGraph) return cudnn_graph_backward(args, stream);
  return cudnn_backward(args, stream) ? "" : "cudnnFind* returned no working algorithm";
}

}  // namespace

void backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream) {
  check_shape(args.shape);
  if (args.dy == nullptr) throw std::invalid_argument("dy: null device pointer");
  if (args.x == nullptr) throw std::invalid_argument("x: null device pointer");
  if (args.w == nullptr) throw std::invalid_argument("w: null device pointer");
  if (args.dx == nullptr && args.dw == nullptr && args.dbias == nullptr) return;
  const Epilogue epilogue{args.act, args.bias != nullptr, false};
  require_supported(kernel, args.shape, epilogue, true);
  if (kernel == Kernel::CudnnGraph || kernel == Kernel::Cudnn) {
    const std::string declined = try_cudnn_backward(kernel, args, stream);
    if (!declined.empty()) throw_declined(kernel, declined);
    return;
  }
  if (kernel == Kernel::CutlassSm90) return cutlass_sm90_backward(args, stream);
  const Shape& s = args.shape;
  const int64_t cg = s.c / s.groups, kg = s.k / s.groups, npq = s.n * s.p * s.q, rsc = cg * s.r * s.s;
  const bool nhwc = s.layout == Layout::NHWC;
  const bool recompute = args.act != Act::None;
  const bool need_col = recompute || args.dw != nullptr;

  const std::size_t col_bytes = need_col ? round_up(im2col_col_elements(s) * dtype_size(s.dtype)) : 0;
  const std::size_t acc_bytes = recompute ? round_up(static_cast<std::size_t>(s.k * npq) * sizeof(float)) : 0;
  const std::size_t dz_bytes = round_up(static_cast<std::size_t>(s.k * npq) * dtype_size(s.dtype));
  const std::size_t dcol_bytes = args.dx != nullptr ? round_up(im2col_col_elements(s) * sizeof(float)) : 0;
  char* scratch = static_cast<char*>(StreamWorkspace::get(col_bytes + acc_bytes + dz_bytes + dcol_bytes, stream));
  void* col = scratch;
  float* acc = reinterpret_cast<float*>(scratch + col_bytes);
  void* dz = scratch + col_bytes + acc_bytes;
  float* dcol = reinterpret_cast<float*>(scratch + col_bytes + acc_bytes + dz_bytes);

  if (recompute) {
    im2col_gemm_accumulate(s, args.x, args.w, col, acc, args.allow_tf32, stream);
  } else if (need_col) {
    launch_im2col(s, args.x, col, stream);
  }
  launch_output_grad(s, args.dy, recompute ? acc : nullptr, args.bias, dz, args.act, args.slope, stream);
  if (args.dbias != nullptr) launch_bias_grad(s, dz, args.dbias, /*gemm_layout=*/true, stream);

  GemmCall base;
  base.batch = s.groups;
  base.dtype = s.dtype;
  base.allow_tf32 = args.allow_tf32;
  if (args.dw != nullptr) {
    GemmCall call = base;
    call.c = args.dw, call.c_dtype = s.dtype, call.ldc = rsc, call.stride_c = kg * rsc;
    call.m = kg, call.n = rsc, call.k = npq;
    if (nhwc) {  // dW[g] (Kg x RSCg) = dz[g]^T (Kg x NPQ) @ col[g] (NPQ x RSCg)
      call.a = dz, call.lda = s.k, call.stride_a = kg, call.trans_a = true;
      call.b = col, call.ldb = rsc, call.stride_b = npq * rsc;
    } else {  // dW[g] (Kg x CgRS) = dz[g] (Kg x NPQ) @ col[g]^T (NPQ x CgRS)
      call.a = dz, call.lda = npq, call.stride_a = kg * npq;
      call.b = col, call.ldb = npq, call.stride_b = rsc * npq, call.trans_b = true;
    }
    batched_gemm(call, stream);
  }
  if (args.dx != nullptr) {
    GemmCall call = base;
    call.c = dcol, call.c_dtype = DType::Float32;
    if (nhwc) {  // dcol[g] (NPQ x RSCg) = dz[g] (NPQ x Kg) @ W[g] (Kg x RSCg)
      call.a = dz, call.lda = s.k, call.stride_a = kg;
      call.b = args.w, call.ldb = rsc, call.stride_b = kg * rsc;
      call.ldc = rsc, call.stride_c = npq * rsc;
      call.m = npq, call.n = rsc, call.k = kg;
    } else {  // dcol[g] (CgRS x NPQ) = W[g]^T (CgRS x Kg) @ dz[g] (Kg x NPQ)
      call.a = args.w, call.lda = rsc, call.stride_a = kg * rsc, call.trans_a = true;
      call.b = dz, call.ldb = npq, call.stride_b = kg * npq;
      call.ldc = npq, call.stride_c = rsc * npq;
      call.m = rsc, call.n = npq, call.k = kg;
    }
    batched_gemm(call, stream);
    launch_col2im(s, dcol, args.dx, stream);
  }
}

}  // namespace ge2::conv2d
