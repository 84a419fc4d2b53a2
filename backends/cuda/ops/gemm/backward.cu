// gemm backward. With Z the pre-activation and dZ = dY * act'(Z):
//   dA = alpha * dZ @ op(B)^T (transposed back when trans_a), dB = alpha * op(A)^T @ dZ (likewise for trans_b),
//   dbias = column sums of dZ, dC = beta * dZ (beta * dY when the residual was added after the activation).
// Chained layers (a_act set): dA becomes the previous layer's pre-activation gradient, through DGELU_BGRAD when it
// applies and a post-kernel otherwise (DRELU needs cuBLASLt's relu bit-mask, which a dense pre-activation is not).
// The call names its kernel (the Python selector chooses it, as for the forward):
// - cublaslt_epilogue: cuBLASLt matmuls; dbias rides on the dB matmul as the BGRADA/BGRADB epilogue (alpha == 1), a
//   chained gelu on the dA matmul as DGELU_BGRAD (trans_a false, K % 8 == 0, 16-byte aligned pointers);
// - cublaslt_postkernel: plain cuBLASLt matmuls, dbias and the chained activation by the post-kernels below;
// - tiled: the tiled kernel's matmuls and the same post-kernels.
// A kernel that cannot run the call (cuBLASLt has no algorithm for one of its matmuls) is refused before any work.
#include <algorithm>

#include "api.hpp"
#include "cublaslt_cache.hpp"
#include "status.hpp"
#include "vector_access.hpp"

namespace ge2::gemm {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t work) { return static_cast<int>(std::min<int64_t>((work + kThreads - 1) / kThreads, 132 * 16)); }

// out = scale * dy * act'(z)  (act None: out = scale * dy). Elementwise over m*n; out may alias dy (in place).
template <typename T>
__global__ void activation_grad(const T* dy, const T* __restrict__ z, T* out, int64_t total,
                                Act act, float slope, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float derivative = z != nullptr ? act_derivative(act, to_float(z[i]), slope) : 1.0f;
    out[i] = from_float<T>(scale * to_float(dy[i]) * derivative);
  }
}

// Pass 1: partial[chunk][col] = sum of dz[rows of chunk][col]. 32 columns per block so a warp reads 32 adjacent
// elements of a row; 8 row lanes per block, reduced through shared memory.
template <typename T>
__global__ void column_partial_sums(const T* __restrict__ dz, float* __restrict__ partial, int64_t m, int64_t n,
                                    int64_t rows_per_chunk) {
  __shared__ float sums[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t row_end = std::min<int64_t>(m, row_begin + rows_per_chunk);
  float sum = 0.0f;
  if (col < n) {
    for (int64_t row = row_begin + threadIdx.y; row < row_end; row += 8) sum += to_float(dz[row * n + col]);
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) total += sums[i][threadIdx.x];
    partial[blockIdx.y * n + col] = total;
  }
}

// Pass 2: dbias[col] = sum over chunks, in a fixed order (deterministic).
template <typename T>
__global__ void column_sum_finish(const float* __restrict__ partial, T* __restrict__ out, int64_t chunks, int64_t n) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  float total = 0.0f;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) total += partial[chunk * n + col];
  out[col] = from_float<T>(total);
}

void launch_activation_grad(const void* dy, const void* z, void* out, int64_t total, DType dtype, Act act,
                            float slope, float scale, cudaStream_t stream) {
  GE2_DISPATCH_FLOATING(dtype, "dtype",
                        activation_grad<scalar_t><<<grid_for(total), kThreads, 0, stream>>>(
                            static_cast<const scalar_t*>(dy), static_cast<const scalar_t*>(z),
                            static_cast<scalar_t*>(out), total, act, slope, scale));
  GE2_CHECK_LAUNCH("gemm activation_grad");
}

// The partial sums live in the stream's cuBLASLt workspace: stream order keeps them apart from the matmuls.
void launch_column_sum(const void* dz, void* out, int64_t m, int64_t n, DType dtype, cudaStream_t stream) {
  const int device = current_device();
  auto* partial = static_cast<float*>(LtResources::instance().workspace(device, stream));
  const int64_t max_chunks = std::max<int64_t>(1, static_cast<int64_t>(kLtWorkspaceBytes / sizeof(float)) / n);
  const int64_t chunks = std::min<int64_t>({max_chunks, (m + 255) / 256, 64});
  const int64_t rows_per_chunk = (m + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(chunks));
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    column_partial_sums<scalar_t><<<grid, dim3(32, 8), 0, stream>>>(static_cast<const scalar_t*>(dz), partial, m, n,
                                                                    rows_per_chunk);
    GE2_CHECK_LAUNCH("gemm column_partial_sums");
    column_sum_finish<scalar_t><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        partial, static_cast<scalar_t*>(out), chunks, n);
    GE2_CHECK_LAUNCH("gemm column_sum_finish");
  });
}

// One matmul of a backward call: the plain product alpha * op(A) @ op(B) (what the tiled kernel runs) and its
// cuBLASLt call (the same product, with the epilogue the kernel adds to it).
struct Matmul {
  ForwardArgs problem;
  LtCall lt;
};

// The matmuls of one backward call for one kernel. `fused_*`: an epilogue computes that bias gradient.
struct BackwardMatmuls {
  bool with_da = false, with_db = false;
  Matmul da, db;
  bool fused_chain = false;  // DGELU_BGRAD: gelu' and the previous layer's bias gradient in the dA matmul
  bool fused_dbias = false;  // BGRADA/BGRADB: dbias in the dB matmul
};

Matmul plain_matmul(const void* a, const void* b, void* d, int64_t m, int64_t n, int64_t k, bool trans_a,
                    bool trans_b, const BackwardArgs& args) {
  Matmul matmul;
  ForwardArgs& problem = matmul.problem;
  problem.a = a;
  problem.b = b;
  problem.y = d;
  problem.m = m;
  problem.n = n;
  problem.k = k;
  problem.dtype = args.dtype;
  problem.trans_a = trans_a;
  problem.trans_b = trans_b;
  problem.alpha = args.alpha;
  problem.allow_tf32 = args.allow_tf32;
  matmul.lt = lt_call_for(problem);
  return matmul;
}

const void* dz_of(const BackwardArgs& args) { return args.act != Act::None ? args.dz_scratch : args.dy; }

BackwardMatmuls backward_matmuls(const BackwardArgs& args, Kernel kernel) {
  const int64_t m = args.m, n = args.n, k = args.k;
  const void* dz = dz_of(args);
  const bool epilogues = kernel == Kernel::LtEpilogue;
  BackwardMatmuls matmuls;
  if (args.da != nullptr) {
    matmuls.with_da = true;
    if (!args.trans_a) {  // dZ @ op(B)^T
      matmuls.da = plain_matmul(dz, args.b, args.da, m, k, n, false, !args.trans_b, args);
      matmuls.fused_chain = epilogues && args.a_act == Act::Gelu && args.dbias_a != nullptr && k % 8 == 0 &&
                            is_aligned(args.a_preact, 16) && is_aligned(args.dbias_a, 16);
      if (matmuls.fused_chain) {
        matmuls.da.lt.aux = args.a_preact;
        matmuls.da.lt.bias = args.dbias_a;
        matmuls.da.lt.epilogue = LtEpilogue::GeluGradBiasGrad;
      }
    } else {  // op(B) @ dZ^T
      matmuls.da = plain_matmul(args.b, dz, args.da, k, m, n, args.trans_b, true, args);
    }
  }
  if (args.db != nullptr) {
    matmuls.with_db = true;
    // dbias through BGRAD on the dB matmul: the reduction is over that matmul's k (= m rows of dZ). alpha scales
    // the matmul but not the bias gradient, so BGRAD is used only when alpha == 1.
    matmuls.fused_dbias = epilogues && args.dbias != nullptr && args.alpha == 1.0f;
    if (!args.trans_b) {  // dB[k x n] = op(A)^T @ dZ; dZ is cuBLASLt's A operand
      matmuls.db = plain_matmul(args.a, dz, args.db, k, n, m, !args.trans_a, false, args);
      if (matmuls.fused_dbias) matmuls.db.lt.epilogue = LtEpilogue::BiasGradA;
    } else {  // dB[n x k] = dZ^T @ op(A); dZ is cuBLASLt's B operand
      matmuls.db = plain_matmul(dz, args.a, args.db, n, k, m, true, args.trans_a, args);
      if (matmuls.fused_dbias) matmuls.db.lt.epilogue = LtEpilogue::BiasGradB;
    }
    if (matmuls.fused_dbias) matmuls.db.lt.bias = args.dbias;
  }
  return matmuls;
}

std::string describe(const char* which, const LtCall& call) {
  std::string text = std::string("cuBLASLt returned no algorithm for the ") + which + " matmul (" +
                     std::to_string(call.m) + " x " + std::to_string(call.n) + " x " + std::to_string(call.k) +
                     (call.trans_a ? ", A transposed" : "") + (call.trans_b ? ", B transposed" : "");
  switch (call.epilogue) {
    case LtEpilogue::BiasGradA: text += ", BGRADA epilogue"; break;
    case LtEpilogue::BiasGradB: text += ", BGRADB epilogue"; break;
    case LtEpilogue::GeluGradBiasGrad: text += ", DGELU_BGRAD epilogue"; break;
    default: break;
  }
  return text + ")";
}

// One matmul of the call on `kernel`: cuBLASLt (which the reason check found an algorithm for) or the tiled kernel.
void run_matmul(const Matmul& matmul, Kernel kernel, const char* which, cudaStream_t stream) {
  if (kernel == Kernel::Tiled) {
    launch_tiled(matmul.problem, stream);
    return;
  }
  // Every algorithm the heuristic returned failed with NOT_SUPPORTED when run (rare: the reason check passed).
  if (!lt_matmul(matmul.lt, stream)) {
    throw std::runtime_error(std::string("ge2 op 'gemm' backward: kernel '") + kernel_name(kernel) + "': " +
                             describe(which, matmul.lt));
  }
}

void check_backward_args(const BackwardArgs& args) {
  if (args.m < 1 || args.n < 1 || args.k < 1) throw std::invalid_argument("m, n, k: every dimension must be >= 1");
  if (!is_floating(args.dtype)) throw std::invalid_argument("dtype: expected float32, float16 or bfloat16");
  if (args.dy == nullptr || args.a == nullptr || args.b == nullptr) {
    throw std::invalid_argument("dy, a, b: null device pointer");
  }
  if (args.act != Act::None && (args.preact == nullptr || args.dz_scratch == nullptr)) {
    throw std::invalid_argument("preact: required (with a dz scratch buffer) when act is not none");
  }
  if (args.a_act != Act::None && (args.a_preact == nullptr || args.da == nullptr)) {
    throw std::invalid_argument("a_preact: required (with dA) when a_act is not none");
  }
}

}  // namespace

std::string backward_unsupported_reason(Kernel kernel, const BackwardArgs& args) {
  check_backward_args(args);
  if (kernel == Kernel::CutlassSm90) {
    return "cutlass_sm90 has no backward (the backward kernels: cublaslt_epilogue, cublaslt_postkernel, tiled)";
  }
  if (kernel == Kernel::Tiled) return "";
  const BackwardMatmuls matmuls = backward_matmuls(args, kernel);
  if (matmuls.with_da && !lt_has_algorithm(matmuls.da.lt)) return describe("dA", matmuls.da.lt);
  if (matmuls.with_db && !lt_has_algorithm(matmuls.db.lt)) return describe("dB", matmuls.db.lt);
  return "";
}

void backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream) {
  const std::string reason = backward_unsupported_reason(kernel, args);
  if (!reason.empty()) {
    throw std::invalid_argument(std::string("ge2 op 'gemm' backward: kernel '") + kernel_name(kernel) +
                                "' cannot run this problem: " + reason);
  }
  const int64_t m = args.m, n = args.n, k = args.k;
  if (args.act != Act::None) {
    launch_activation_grad(args.dy, args.preact, args.dz_scratch, m * n, args.dtype, args.act, args.slope, 1.0f,
                           stream);
  }
  const void* dz = dz_of(args);
  const BackwardMatmuls matmuls = backward_matmuls(args, kernel);
  if (matmuls.with_da) {
    run_matmul(matmuls.da, kernel, "dA", stream);
    if (args.a_act != Act::None && !matmuls.fused_chain) {
      // The producer's pre-activation gradient in place, then its bias gradient over the stored layout.
      launch_activation_grad(args.da, args.a_preact, args.da, m * k, args.dtype, args.a_act, args.a_slope, 1.0f,
                             stream);
      const int64_t rows = args.trans_a ? k : m, cols = args.trans_a ? m : k;
      if (args.dbias_a != nullptr) launch_column_sum(args.da, args.dbias_a, rows, cols, args.dtype, stream);
    }
  }
  if (matmuls.with_db) run_matmul(matmuls.db, kernel, "dB", stream);
  if (args.dbias != nullptr && !matmuls.fused_dbias) launch_column_sum(dz, args.dbias, m, n, args.dtype, stream);
  if (args.dc != nullptr) {
    launch_activation_grad(args.residual_after_act ? args.dy : dz, nullptr, args.dc, m * n, args.dtype, Act::None,
                           0.0f, args.beta, stream);
  }
}

}  // namespace ge2::gemm
