// The math of every elementwise op, forward and backward, as functors on float32 values. Each functor reads kIn
// values and writes kOut; the kernels in kernels/map.cuh and backward.cu move the data around them.
#pragma once
#include "activation.hpp"
#include "api.hpp"

namespace ge2::elementwise {

template <UnaryOp Op>
__device__ __forceinline__ float unary_value(float x) {
  if constexpr (Op == UnaryOp::Relu) return apply_act(Act::Relu, x, 0.0f);
  if constexpr (Op == UnaryOp::Gelu) return apply_act(Act::Gelu, x, 0.0f);
  if constexpr (Op == UnaryOp::GeluErf) return apply_act(Act::GeluErf, x, 0.0f);
  if constexpr (Op == UnaryOp::Silu) return apply_act(Act::Silu, x, 0.0f);
  if constexpr (Op == UnaryOp::Sigmoid) return apply_act(Act::Sigmoid, x, 0.0f);
  if constexpr (Op == UnaryOp::Tanh) return apply_act(Act::Tanh, x, 0.0f);
  if constexpr (Op == UnaryOp::Exp) return expf(x);
  if constexpr (Op == UnaryOp::Neg) return -x;
  return x;
}

template <UnaryOp Op>
__device__ __forceinline__ float unary_derivative(float x) {
  if constexpr (Op == UnaryOp::Relu) return act_derivative(Act::Relu, x, 0.0f);
  if constexpr (Op == UnaryOp::Gelu) return act_derivative(Act::Gelu, x, 0.0f);
  if constexpr (Op == UnaryOp::GeluErf) return act_derivative(Act::GeluErf, x, 0.0f);
  if constexpr (Op == UnaryOp::Silu) return act_derivative(Act::Silu, x, 0.0f);
  if constexpr (Op == UnaryOp::Sigmoid) return act_derivative(Act::Sigmoid, x, 0.0f);
  if constexpr (Op == UnaryOp::Tanh) return act_derivative(Act::Tanh, x, 0.0f);
  if constexpr (Op == UnaryOp::Exp) return expf(x);
  if constexpr (Op == UnaryOp::Neg) return -1.0f;
  return 1.0f;
}

template <BinaryOp Op>
__device__ __forceinline__ float binary_value(float a, float b) {
  if constexpr (Op == BinaryOp::Add) return a + b;
  if constexpr (Op == BinaryOp::Sub) return a - b;
  if constexpr (Op == BinaryOp::Mul) return a * b;
  if constexpr (Op == BinaryOp::Div) return a / b;
  return a;
}

// y = op(x)
template <UnaryOp Op>
struct UnaryForward {
  static constexpr int kIn = 1, kOut = 1;
  __device__ __forceinline__ void operator()(const float* in, float* out) const { out[0] = unary_value<Op>(in[0]); }
};

// y = a (op) b
template <BinaryOp Op>
struct BinaryForward {
  static constexpr int kIn = 2, kOut = 1;
  __device__ __forceinline__ void operator()(const float* in, float* out) const {
    out[0] = binary_value<Op>(in[0], in[1]);
  }
};

// (dy, x) -> dx = dy * op'(x)
template <UnaryOp Op>
struct UnaryBackward {
  static constexpr int kIn = 2, kOut = 1;
  __device__ __forceinline__ void operator()(const float* in, float* out) const {
    if constexpr (Op == UnaryOp::Neg) {
      out[0] = -in[0];
    } else {
      out[0] = in[0] * unary_derivative<Op>(in[1]);
    }
  }
};

// The gradient of one operand at one output element: (dy, a, b) -> d(a op b)/d(operand) * dy. Inputs the math
// does not use are never read (their loads are dead code).
template <BinaryOp Op, int kOperand>
struct BinaryGrad {
  static constexpr int kIn = 3, kOut = 1;
  __device__ __forceinline__ void operator()(const float* in, float* out) const {
    const float dy = in[0], a = in[1], b = in[2];
    if constexpr (Op == BinaryOp::Add) out[0] = dy;
    if constexpr (Op == BinaryOp::Sub) out[0] = kOperand == 0 ? dy : -dy;
    if constexpr (Op == BinaryOp::Mul) out[0] = kOperand == 0 ? dy * b : dy * a;
    if constexpr (Op == BinaryOp::Div) out[0] = kOperand == 0 ? dy / b : -(dy / b) * (a / b);
  }
};

// Both gradients of same-shape operands in one pass: add and sub read only dy, mul and div read (dy, a, b).
template <BinaryOp Op>
struct BinaryGradBoth {
  static constexpr bool kReadsOperands = Op == BinaryOp::Mul || Op == BinaryOp::Div;
  static constexpr int kIn = kReadsOperands ? 3 : 1, kOut = 2;
  __device__ __forceinline__ void operator()(const float* in, float* out) const {
    const float dy = in[0];
    if constexpr (Op == BinaryOp::Add) {
      out[0] = dy;
      out[1] = dy;
    } else if constexpr (Op == BinaryOp::Sub) {
      out[0] = dy;
      out[1] = -dy;
    } else if constexpr (Op == BinaryOp::Mul) {
      out[0] = dy * in[2];
      out[1] = dy * in[1];
    } else {
      const float q = dy / in[2];
      out[0] = q;
      out[1] = -q * (in[1] / in[2]);
    }
  }
};

}  // namespace ge2::elementwise

// Runs the statement with `kOp` bound to the UnaryOp / BinaryOp value of `op` as a compile-time constant.
#define GE2_DISPATCH_UNARY(op, ...)                                                                       \
  switch (op) {                                                                                           \
    case UnaryOp::Relu: { constexpr UnaryOp kOp = UnaryOp::Relu; __VA_ARGS__; break; }                    \
    case UnaryOp::Gelu: { constexpr UnaryOp kOp = UnaryOp::Gelu; __VA_ARGS__; break; }                    \
    case UnaryOp::GeluErf: { constexpr UnaryOp kOp = UnaryOp::GeluErf; __VA_ARGS__; break; }              \
    case UnaryOp::Silu: { constexpr UnaryOp kOp = UnaryOp::Silu; __VA_ARGS__; break; }                    \
    case UnaryOp::Sigmoid: { constexpr UnaryOp kOp = UnaryOp::Sigmoid; __VA_ARGS__; break; }              \
    case UnaryOp::Tanh: { constexpr UnaryOp kOp = UnaryOp::Tanh; __VA_ARGS__; break; }                    \
    case UnaryOp::Exp: { constexpr UnaryOp kOp = UnaryOp::Exp; __VA_ARGS__; break; }                      \
    case UnaryOp::Neg: { constexpr UnaryOp kOp = UnaryOp::Neg; __VA_ARGS__; break; }                      \
  }

#define GE2_DISPATCH_BINARY(op, ...)                                                                      \
  switch (op) {                                                                                           \
    case BinaryOp::Add: { constexpr BinaryOp kOp = BinaryOp::Add; __VA_ARGS__; break; }                   \
    case BinaryOp::Sub: { constexpr BinaryOp kOp = BinaryOp::Sub; __VA_ARGS__; break; }                   \
    case BinaryOp::Mul: { constexpr BinaryOp kOp = BinaryOp::Mul; __VA_ARGS__; break; }                   \
    case BinaryOp::Div: { constexpr BinaryOp kOp = BinaryOp::Div; __VA_ARGS__; break; }                   \
  }
