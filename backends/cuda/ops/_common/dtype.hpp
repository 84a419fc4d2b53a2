// Element types shared by every op module, their names (as Python spells them) and host/device conversions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ge2 {

enum class DType : int { Float32 = 0, Float16 = 1, BFloat16 = 2, Int32 = 3, Int64 = 4, UInt8 = 5 };

inline constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
  }
  return "unknown";
}

// Raises std::invalid_argument (ValueError in Python) naming the argument on an unknown name.
inline DType dtype_from_name(const std::string& name, const char* argument = "dtype") {
  if (name == "float32") return DType::Float32;
  if (name == "float16") return DType::Float16;
  if (name == "bfloat16") return DType::BFloat16;
  if (name == "int32") return DType::Int32;
  if (name == "int64") return DType::Int64;
  if (name == "uint8") return DType::UInt8;
  throw std::invalid_argument(std::string(argument) +
                              ": expected one of float32, float16, bfloat16, int32, int64, uint8, got '" +
                              name + "'");
}

inline bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float16 || dtype == DType::BFloat16;
}

// Float math happens in float32; these move values in and out of the storage types.
__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__host__ __device__ __forceinline__ T from_float(float x);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace ge2

// Runs the statement with `scalar_t` bound to the storage type of a floating dtype.
#define GE2_DISPATCH_FLOATING(dtype, argument, ...)                                                   \
  switch (dtype) {                                                                                  \
    case ::ge2::DType::Float32: { using scalar_t = float; __VA_ARGS__; break; }                     \
    case ::ge2::DType::Float16: { using scalar_t = __half; __VA_ARGS__; break; }                    \
    case ::ge2::DType::BFloat16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; }            \
    default:                                                                                        \
      throw std::invalid_argument(std::string(argument) + ": expected float32, float16 or bfloat16, " \
                                  "got " + ::ge2::dtype_name(dtype));                               \
  }
