// swiglu: y = silu(a) * b = a * sigmoid(a) * b, elementwise over a (the gate) and b (the up projection), two
// inputs of one shape and dtype (float32, float16, bfloat16; float32 math). Backward:
//   db = dy * silu(a),  da = dy * b * sigmoid(a) * (1 + a * (1 - sigmoid(a))).
// Two kernel variants: kernels/scalar.cu (element by element, any size and alignment) and kernels/vec16.cu
// (16-byte loads and stores: 16-byte aligned arrays and a multiple of 16 bytes of elements).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dtype.hpp"
#include "kernel_info.hpp"

namespace ge2::swiglu {

// GE2's selector (graph_executor_v2/selection.py) chooses the kernel; a call names it.
enum class Kernel { Vec16, Scalar };

Kernel kernel_from_name(const std::string& name);
const char* kernel_name(Kernel kernel);

struct ForwardArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  int64_t count = 0;  // elements of every array
  DType dtype = DType::Float32;
};

struct BackwardArgs {
  const void* dy = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  void* da = nullptr;  // nullptr: not asked for
  void* db = nullptr;
  int64_t count = 0;
  DType dtype = DType::Float32;
};

// Check the arguments (std::invalid_argument naming the argument, or why `kernel` cannot run the problem), run
// `kernel` on `stream` and return it. Nothing is launched for count == 0.
Kernel forward(const ForwardArgs& args, Kernel kernel, cudaStream_t stream);
Kernel backward(const BackwardArgs& args, Kernel kernel, cudaStream_t stream);

// Empty when `kernel` can run `count` elements of `dtype`; otherwise why not. `aligned`: every array 16-byte aligned.
std::string unsupported_reason(Kernel kernel, int64_t count, DType dtype, bool aligned);

std::vector<KernelInfo> kernel_table();

// ---- internal: launcher.cu -> kernels/*.cu --------------------------------------------------------------------
void launch_forward_scalar(const ForwardArgs& args, cudaStream_t stream);
void launch_backward_scalar(const BackwardArgs& args, cudaStream_t stream);
void launch_forward_vec16(const ForwardArgs& args, cudaStream_t stream);
void launch_backward_vec16(const BackwardArgs& args, cudaStream_t stream);

}  // namespace ge2::swiglu
