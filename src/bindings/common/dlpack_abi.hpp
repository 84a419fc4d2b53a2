// The DLPack ABI (https://dmlc.github.io/dlpack), legacy and versioned forms: the C structs that cross module
// boundaries when PyTorch, CuPy and GE2 exchange device arrays without copies.
#pragma once
#include <cstdint>

namespace ge2::dlpack {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13 };
// kFloat8_e4m3fn and kFloat8_e5m2 came with DLPack 1.1 (what torch's float8_e4m3fn / float8_e5m2 tensors export).
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kBool = 6, kFloat8_e4m3fn = 10, kFloat8_e5m2 = 12 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means compact row-major
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
struct Version {
  uint32_t major;
  uint32_t minor;
};
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

constexpr uint64_t kFlagReadOnly = 1ull << 0;
constexpr uint32_t kMajorVersion = 1;
constexpr uint32_t kMinorVersion = 1;
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kVersionedCapsuleName = "dltensor_versioned";
constexpr const char* kUsedVersionedCapsuleName = "used_dltensor_versioned";

}  // namespace ge2::dlpack
