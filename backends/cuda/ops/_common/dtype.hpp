// Element types shared by every op module, their names (as Python spells them) and host/device conversions.
// float8_e4m3fn and float8_e5m2 (Hopper's FP8, the OCP formats) are storage types: GEMMs read them and casts write
// them, with saturation to the largest finite value (448 and 57344), as cuBLASLt and Transformer Engine do.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace ge2 {

// Bool: one byte per element, 0 or 1 (NumPy's bool_, DLPack's kDLBool): masks from comparisons and logical ops.
enum class DType : int {
  Float32 = 0, Float16 = 1, BFloat16 = 2, Int32 = 3, Int64 = 4, UInt8 = 5, Float8E4M3 = 6, Float8E5M2 = 7, Bool = 8
};

inline constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
    case DType::Float8E4M3: return 1;
    case DType::Float8E5M2: return 1;
    case DType::Bool: return 1;
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
    case DType::Float8E4M3: return "float8_e4m3fn";
    case DType::Float8E5M2: return "float8_e5m2";
    case DType::Bool: return "bool";
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
  if (name == "float8_e4m3fn") return DType::Float8E4M3;
  if (name == "float8_e5m2") return DType::Float8E5M2;
  if (name == "bool") return DType::Bool;
  throw std::invalid_argument(std::string(argument) +
                              ": expected one of float32, float16, bfloat16, int32, int64, uint8, float8_e4m3fn, "
                              "float8_e5m2, bool, got '" + name + "'");
}

// The dtypes kernels compute in (FP8 is storage only: see is_float8).
inline bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float16 || dtype == DType::BFloat16;
}

inline bool is_float8(DType dtype) { return dtype == DType::Float8E4M3 || dtype == DType::Float8E5M2; }

// The largest finite value of an FP8 format: what a saturating cast clamps to.
inline constexpr float float8_max(DType dtype) { return dtype == DType::Float8E4M3 ? 448.0f : 57344.0f; }

// Float math happens in float32; these move values in and out of the storage types.
__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
__host__ __device__ __forceinline__ float to_float(__nv_fp8_e5m2 x) { return static_cast<float>(x); }

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
// FP8: round to nearest even, saturating: beyond the largest finite value (infinities included) gives it, NaN stays
// NaN (cvt.rn.satfinite on sm_89+).
template <>
__host__ __device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 result;
  result.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return result;
}
template <>
__host__ __device__ __forceinline__ __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float x) {
  __nv_fp8_e5m2 result;
  result.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  return result;
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

// GE2_DISPATCH_FLOATING plus the two FP8 storage types: for kernels that only convert (cast, quantize).
#define GE2_DISPATCH_FLOATING_AND_FLOAT8(dtype, argument, ...)                                          \
  switch (dtype) {                                                                                  \
    case ::ge2::DType::Float32: { using scalar_t = float; __VA_ARGS__; break; }                     \
    case ::ge2::DType::Float16: { using scalar_t = __half; __VA_ARGS__; break; }                    \
    case ::ge2::DType::BFloat16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; }            \
    case ::ge2::DType::Float8E4M3: { using scalar_t = __nv_fp8_e4m3; __VA_ARGS__; break; }          \
    case ::ge2::DType::Float8E5M2: { using scalar_t = __nv_fp8_e5m2; __VA_ARGS__; break; }          \
    default:                                                                                        \
      throw std::invalid_argument(std::string(argument) + ": expected float32, float16, bfloat16, "   \
                                  "float8_e4m3fn or float8_e5m2, got " + ::ge2::dtype_name(dtype)); \
  }
