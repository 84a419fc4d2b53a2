// Activation functors shared by gemm epilogues and elementwise ops. All math in float32.
// GELU comes in the tanh form (what cuBLASLt's GELU epilogue computes) and the exact erf form.
#pragma once
#include <cmath>  // expf, tanhf, erff: host-compiled bindings include this header too
#include <stdexcept>
#include <string>

namespace ge2 {

enum class Act : int { None = 0, Relu, Gelu, GeluErf, Silu, LeakyRelu, Sigmoid, Tanh };

inline Act act_from_name(const std::string& name, const char* argument = "act") {
  if (name == "none") return Act::None;
  if (name == "relu") return Act::Relu;
  if (name == "gelu") return Act::Gelu;
  if (name == "gelu_erf") return Act::GeluErf;
  if (name == "silu") return Act::Silu;
  if (name == "leaky_relu") return Act::LeakyRelu;
  if (name == "sigmoid") return Act::Sigmoid;
  if (name == "tanh") return Act::Tanh;
  throw std::invalid_argument(std::string(argument) +
                              ": expected one of none, relu, gelu, gelu_erf, silu, leaky_relu, sigmoid, tanh, got '" +
                              name + "'");
}

inline const char* act_name(Act act) {
  switch (act) {
    case Act::None: return "none";
    case Act::Relu: return "relu";
    case Act::Gelu: return "gelu";
    case Act::GeluErf: return "gelu_erf";
    case Act::Silu: return "silu";
    case Act::LeakyRelu: return "leaky_relu";
    case Act::Sigmoid: return "sigmoid";
    case Act::Tanh: return "tanh";
  }
  return "unknown";
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__host__ __device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__host__ __device__ __forceinline__ float apply_act(Act act, float z, float slope) {
  switch (act) {
    case Act::None: return z;
    case Act::Relu: return z > 0.0f ? z : 0.0f;
    case Act::Gelu: return 0.5f * z * (1.0f + tanhf(kSqrt2OverPi * (z + kGeluCubic * z * z * z)));
    case Act::GeluErf: return 0.5f * z * (1.0f + erff(z * kInvSqrt2));
    case Act::Silu: return z * sigmoidf(z);
    case Act::LeakyRelu: return z > 0.0f ? z : slope * z;
    case Act::Sigmoid: return sigmoidf(z);
    case Act::Tanh: return tanhf(z);
  }
  return z;
}

// d act(z) / dz, evaluated at the pre-activation z.
__host__ __device__ __forceinline__ float act_derivative(Act act, float z, float slope) {
  switch (act) {
    case Act::None: return 1.0f;
    case Act::Relu: return z > 0.0f ? 1.0f : 0.0f;
    case Act::Gelu: {
      const float inner = kSqrt2OverPi * (z + kGeluCubic * z * z * z);
      const float t = tanhf(inner);
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * z * z);
      return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * dinner;
    }
    case Act::GeluErf: return 0.5f * (1.0f + erff(z * kInvSqrt2)) + z * kInvSqrt2Pi * expf(-0.5f * z * z);
    case Act::Silu: {
      const float s = sigmoidf(z);
      return s * (1.0f + z * (1.0f - s));
    }
    case Act::LeakyRelu: return z > 0.0f ? 1.0f : slope;
    case Act::Sigmoid: {
      const float s = sigmoidf(z);
      return s * (1.0f - s);
    }
    case Act::Tanh: {
      const float t = tanhf(z);
      return 1.0f - t * t;
    }
  }
  return 1.0f;
}

}  // namespace ge2
