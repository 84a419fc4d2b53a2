// DeviceArray: a strided n-d array in device memory, owned by GE2 or borrowed (zero-copy) from another library
// through DLPack or __cuda_array_interface__. bfloat16 and float8 host arrays are NumPy arrays of ml_dtypes' types
// (ml_dtypes.bfloat16, float8_e4m3fn, float8_e5m2).
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cuda_runtime.h>

#include "device_array.hpp"
#include "devices.hpp"
#include "dlpack_abi.hpp"
#include "dtype.hpp"
#include "status.hpp"
#include "tensor_view.hpp"

namespace ge2::runtime {
namespace {

void free_on_device(int device, void* pointer) {
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cudaFree(pointer);
  cudaSetDevice(previous);
}

// This thread's graph captures in progress, and the allocations released during them (see capture_begins).
struct CaptureState {
  int depth = 0;
  std::vector<std::pair<int, void*>> deferred;  // (device, pointer)
  std::vector<void*> deferred_host;  // page-locked host memory (pinned_empty)
};

CaptureState& capture_state() {
  thread_local auto* state = new CaptureState();  // never destroyed: arrays may go during the interpreter's teardown
  return *state;
}

// Owned device memory, freed when the last DeviceArray (or exported DLPack tensor) that uses it goes away.
struct DeviceAllocation {
  void* pointer = nullptr;
  int device = 0;
  ~DeviceAllocation() {
    if (pointer == nullptr) return;
    CaptureState& capture = capture_state();
    if (capture.depth > 0) {
      capture.deferred.emplace_back(device, pointer);
      return;
    }
    free_on_device(device, pointer);
  }
};

std::shared_ptr<void> allocate(std::size_t nbytes, int device) {
  DeviceGuard guard(device);
  auto allocation = std::make_shared<DeviceAllocation>();
  allocation->device = device;
  if (nbytes > 0) GE2_CUDA_CHECK(cudaMalloc(&allocation->pointer, nbytes));
  return allocation;
}

// Keeps a foreign Python object (the producer of borrowed memory) alive; safe to drop without the GIL.
std::shared_ptr<void> keep_alive(py::object owner) {
  auto* held = new py::object(std::move(owner));
  return std::shared_ptr<void>(held, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

py::dtype numpy_dtype(DType dtype) {
  if (dtype == DType::BFloat16 || is_float8(dtype)) {
    return py::dtype::from_args(py::module_::import("ml_dtypes").attr(dtype_name(dtype)));
  }
  return py::dtype(std::string(dtype_name(dtype)));
}

DType dtype_from_numpy(const py::dtype& dtype) {
  return dtype_from_name(py::str(dtype.attr("name")).cast<std::string>(), "array.dtype");
}

dlpack::DataType to_dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return {dlpack::kFloat, 32, 1};
    case DType::Float16: return {dlpack::kFloat, 16, 1};
    case DType::BFloat16: return {dlpack::kBfloat, 16, 1};
    case DType::Int32: return {dlpack::kInt, 32, 1};
    case DType::Int64: return {dlpack::kInt, 64, 1};
    case DType::UInt8: return {dlpack::kUInt, 8, 1};
    case DType::Float8E4M3: return {dlpack::kFloat8_e4m3fn, 8, 1};
    case DType::Float8E5M2: return {dlpack::kFloat8_e5m2, 8, 1};
    case DType::Bool: return {dlpack::kBool, 8, 1};
  }
  return {dlpack::kFloat, 32, 1};
}

DType from_dlpack_dtype(dlpack::DataType dtype) {
  if (dtype.lanes == 1) {
    if (dtype.code == dlpack::kFloat && dtype.bits == 32) return DType::Float32;
    if (dtype.code == dlpack::kFloat && dtype.bits == 16) return DType::Float16;
    if (dtype.code == dlpack::kBfloat && dtype.bits == 16) return DType::BFloat16;
    if (dtype.code == dlpack::kInt && dtype.bits == 32) return DType::Int32;
    if (dtype.code == dlpack::kInt && dtype.bits == 64) return DType::Int64;
    if (dtype.code == dlpack::kUInt && dtype.bits == 8) return DType::UInt8;
    if (dtype.code == dlpack::kFloat8_e4m3fn && dtype.bits == 8) return DType::Float8E4M3;
    if (dtype.code == dlpack::kFloat8_e5m2 && dtype.bits == 8) return DType::Float8E5M2;
    if (dtype.code == dlpack::kBool && dtype.bits == 8) return DType::Bool;
  }
  throw std::invalid_argument("DLPack tensor: unsupported dtype (code " + std::to_string(dtype.code) + ", bits " +
                              std::to_string(dtype.bits) + ", lanes " + std::to_string(dtype.lanes) +
                              "); expected float32, float16, bfloat16, int32, int64, uint8, float8_e4m3fn, "
                              "float8_e5m2 or bool");
}

DType dtype_from_typestr(const std::string& typestr) {
  if (typestr.size() >= 3) {
    const char kind = typestr[1];
    const std::string bytes = typestr.substr(2);
    if (kind == 'f' && bytes == "4") return DType::Float32;
    if (kind == 'f' && bytes == "2") return DType::Float16;
    if (kind == 'i' && bytes == "4") return DType::Int32;
    if (kind == 'i' && bytes == "8") return DType::Int64;
    if (kind == 'u' && bytes == "1") return DType::UInt8;
    if (kind == 'b' && bytes == "1") return DType::Bool;
  }
  throw std::invalid_argument("__cuda_array_interface__: unsupported typestr '" + typestr +
                              "'; expected <f4, <f2, <i4, <i8, |u1 or |b1 (bfloat16 and float8 arrays travel through "
                              "DLPack)");
}

std::string typestr_of(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "<f4";
    case DType::Float16: return "<f2";
    case DType::Int32: return "<i4";
    case DType::Int64: return "<i8";
    case DType::UInt8: return "|u1";
    case DType::Bool: return "|b1";
    case DType::BFloat16:
    case DType::Float8E4M3:
    case DType::Float8E5M2: break;
  }
  throw std::invalid_argument(std::string("__cuda_array_interface__ has no typestr for ") + dtype_name(dtype) +
                              "; use DLPack (__dlpack__)");
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t running = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = running;
    running *= shape[i];
  }
  return strides;
}

void check_shape(const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw std::invalid_argument("shape: at most " + std::to_string(kMaxDims) + " dimensions, got " +
                                std::to_string(shape.size()));
  }
  for (int64_t extent : shape) {
    if (extent < 0) throw std::invalid_argument("shape: dimensions must be >= 0");
  }
}

}  // namespace

void capture_begins() { ++capture_state().depth; }

void capture_ends() {
  CaptureState& capture = capture_state();
  if (--capture.depth > 0) return;
  for (const auto& [device, pointer] : capture.deferred) free_on_device(device, pointer);
  capture.deferred.clear();
  for (void* pointer : capture.deferred_host) cudaFreeHost(pointer);
  capture.deferred_host.clear();
}

namespace {

// A uint8 NumPy array of `nbytes` in page-locked host memory (portable: every device's copies may use it), freed
// when the array goes; a CUDA graph's memcpy nodes can copy to and from it, which they cannot with pageable memory.
py::array pinned_empty(std::size_t nbytes) {
  void* pointer = nullptr;
  GE2_CUDA_CHECK(cudaHostAlloc(&pointer, nbytes > 0 ? nbytes : 1, cudaHostAllocPortable));
  py::capsule owner(pointer, [](void* p) {
    CaptureState& capture = capture_state();
    if (capture.depth > 0) {
      capture.deferred_host.push_back(p);
      return;
    }
    cudaFreeHost(p);
  });
  return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(nbytes)}, {static_cast<py::ssize_t>(1)}, pointer,
                   owner);
}

}  // namespace

class DeviceArray {
 public:
  DeviceArray(std::shared_ptr<void> storage, std::uintptr_t address, std::vector<int64_t> shape,
              std::vector<int64_t> strides, DType dtype, int device)
      : storage_(std::move(storage)),
        address_(address),
        shape_(std::move(shape)),
        strides_(std::move(strides)),
        dtype_(dtype),
        device_(device) {}

  static DeviceArray empty(const std::vector<int64_t>& shape, const std::string& dtype_name_, int device) {
    check_shape(shape);
    device = resolve_device(device);
    const DType dtype = dtype_from_name(dtype_name_);
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    auto storage = allocate(static_cast<std::size_t>(count) * dtype_size(dtype), device);
    const auto address = reinterpret_cast<std::uintptr_t>(static_cast<DeviceAllocation*>(storage.get())->pointer);
    return DeviceArray(storage, address, shape, contiguous_strides(shape), dtype, device);
  }

  static DeviceArray from_numpy(const py::array& source, int device, std::uintptr_t stream) {
    py::array host = py::array::ensure(source, py::array::c_style);
    if (!host) throw std::invalid_argument("array: expected a NumPy array or something convertible to one");
    const DType dtype = dtype_from_numpy(host.dtype());
    std::vector<int64_t> shape(host.shape(), host.shape() + host.ndim());
    DeviceArray array = empty(shape, dtype_name(dtype), device);
    array.copy_from_host(host, stream);
    return array;
  }

  void copy_from_host(const py::array& source, std::uintptr_t stream) {
    py::array host = py::array::ensure(source, py::array::c_style);
    if (!host) throw std::invalid_argument("array: expected a NumPy array");
    if (dtype_from_numpy(host.dtype()) != dtype_) {
      throw std::invalid_argument(std::string("array.dtype: expected ") + dtype_name(dtype_) + ", got " +
                                  dtype_name(dtype_from_numpy(host.dtype())));
    }
    std::vector<int64_t> shape(host.shape(), host.shape() + host.ndim());
    if (shape != shape_) throw std::invalid_argument("array.shape: expected " + shape_string(shape_) + ", got " +
                                                     shape_string(shape));
    require_contiguous("copy_from_numpy");
    DeviceGuard guard(device_);
    const auto bytes = nbytes();
    const void* data = host.data();
    py::gil_scoped_release release;
    GE2_CUDA_CHECK(cudaMemcpyAsync(pointer(), data, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
    GE2_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));  // the host buffer may go away after we return
  }

  py::array numpy(std::uintptr_t stream) const {
    require_contiguous("numpy");
    py::array host(numpy_dtype(dtype_), shape_);
    DeviceGuard guard(device_);
    const auto bytes = nbytes();
    void* data = host.mutable_data();
    {
      py::gil_scoped_release release;
      GE2_CUDA_CHECK(cudaMemcpyAsync(data, pointer(), bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
      GE2_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
    }
    return host;
  }

  // Fills every byte with 0xFF: NaN in float32, float16, bfloat16 and both FP8 formats, -1 in integers. Tests
  // poison outputs so that an element a kernel forgot to write can never pass.
  void poison(std::uintptr_t stream) {
    require_contiguous("poison");
    DeviceGuard guard(device_);
    GE2_CUDA_CHECK(cudaMemsetAsync(pointer(), 0xFF, nbytes(), as_stream(stream)));
  }

  void zero(std::uintptr_t stream) {
    require_contiguous("zero");
    DeviceGuard guard(device_);
    GE2_CUDA_CHECK(cudaMemsetAsync(pointer(), 0, nbytes(), as_stream(stream)));
  }

  DeviceArray reshape(const std::vector<int64_t>& shape) const {
    check_shape(shape);
    require_contiguous("reshape");
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    if (count != size()) {
      throw std::invalid_argument("shape: cannot reshape " + shape_string(shape_) + " (" + std::to_string(size()) +
                                  " elements) to " + shape_string(shape));
    }
    return DeviceArray(storage_, address_, shape, contiguous_strides(shape), dtype_, device_);
  }

  // A contiguous view of `shape` and `dtype` over the bytes from `offset` of this (contiguous) array: how a plan's
  // arena is carved into typed slots that share its memory.
  DeviceArray view(std::size_t offset, const std::vector<int64_t>& shape, const std::string& dtype_name_) const {
    check_shape(shape);
    require_contiguous("view");
    const DType dtype = dtype_from_name(dtype_name_);
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
    if (offset % dtype_size(dtype) != 0 || offset + bytes > nbytes()) {
      throw std::invalid_argument("offset: a view of " + std::to_string(bytes) + " bytes at offset " +
                                  std::to_string(offset) + " does not fit (aligned) in " +
                                  std::to_string(nbytes()) + " bytes");
    }
    return DeviceArray(storage_, address_ + offset, shape, contiguous_strides(shape), dtype, device_);
  }

  // --- DLPack export -------------------------------------------------------------------------------------------
  py::capsule to_dlpack(bool versioned) const {
    struct Context {
      std::shared_ptr<void> storage;
      std::vector<int64_t> shape, strides;
    };
    auto* context = new Context{storage_, shape_, strides_};
    dlpack::Tensor tensor{};
    tensor.data = pointer();
    tensor.device = {dlpack::kCUDA, device_};
    tensor.ndim = static_cast<int32_t>(shape_.size());
    tensor.dtype = to_dlpack_dtype(dtype_);
    tensor.shape = context->shape.data();
    tensor.strides = context->strides.data();
    tensor.byte_offset = 0;

    if (versioned) {
      auto* managed = new dlpack::ManagedTensorVersioned{};
      managed->version = {dlpack::kMajorVersion, dlpack::kMinorVersion};
      managed->manager_ctx = context;
      managed->flags = 0;
      managed->dl_tensor = tensor;
      managed->deleter = [](dlpack::ManagedTensorVersioned* self) {
        delete static_cast<Context*>(self->manager_ctx);
        delete self;
      };
      return py::capsule(managed, dlpack::kVersionedCapsuleName, [](PyObject* capsule) {
        // Only an unconsumed capsule still owns its tensor; a consumer renames it to used_dltensor_versioned.
        if (PyCapsule_IsValid(capsule, dlpack::kVersionedCapsuleName)) {
          auto* m = static_cast<dlpack::ManagedTensorVersioned*>(
              PyCapsule_GetPointer(capsule, dlpack::kVersionedCapsuleName));
          if (m != nullptr && m->deleter != nullptr) m->deleter(m);
        }
      });
    }
    auto* managed = new dlpack::ManagedTensor{};
    managed->dl_tensor = tensor;
    managed->manager_ctx = context;
    managed->deleter = [](dlpack::ManagedTensor* self) {
      delete static_cast<Context*>(self->manager_ctx);
      delete self;
    };
    return py::capsule(managed, dlpack::kCapsuleName, [](PyObject* capsule) {
      if (PyCapsule_IsValid(capsule, dlpack::kCapsuleName)) {
        auto* m = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, dlpack::kCapsuleName));
        if (m != nullptr && m->deleter != nullptr) m->deleter(m);
      }
    });
  }

  // --- DLPack import (zero-copy) -------------------------------------------------------------------------------
  static DeviceArray from_dlpack_capsule(py::capsule capsule) {
    PyObject* raw = capsule.ptr();
    const dlpack::Tensor* tensor = nullptr;
    std::shared_ptr<void> owner;
    if (PyCapsule_IsValid(raw, dlpack::kVersionedCapsuleName)) {
      auto* managed =
          static_cast<dlpack::ManagedTensorVersioned*>(PyCapsule_GetPointer(raw, dlpack::kVersionedCapsuleName));
      if (managed->version.major > dlpack::kMajorVersion) {
        throw std::invalid_argument("DLPack tensor: version " + std::to_string(managed->version.major) +
                                    " is newer than the supported " + std::to_string(dlpack::kMajorVersion));
      }
      tensor = &managed->dl_tensor;
      PyCapsule_SetName(raw, dlpack::kUsedVersionedCapsuleName);
      owner = std::shared_ptr<void>(managed, [](void* p) {
        py::gil_scoped_acquire gil;  // some producers' deleters touch Python objects
        auto* m = static_cast<dlpack::ManagedTensorVersioned*>(p);
        if (m->deleter != nullptr) m->deleter(m);
      });
    } else if (PyCapsule_IsValid(raw, dlpack::kCapsuleName)) {
      auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(raw, dlpack::kCapsuleName));
      tensor = &managed->dl_tensor;
      PyCapsule_SetName(raw, dlpack::kUsedCapsuleName);
      owner = std::shared_ptr<void>(managed, [](void* p) {
        py::gil_scoped_acquire gil;
        auto* m = static_cast<dlpack::ManagedTensor*>(p);
        if (m->deleter != nullptr) m->deleter(m);
      });
    } else {
      throw std::invalid_argument("DLPack capsule: expected an unconsumed 'dltensor' or 'dltensor_versioned'");
    }
    if (tensor->device.device_type != dlpack::kCUDA) {
      throw std::invalid_argument("DLPack tensor: expected a CUDA device array (device type 2), got device type " +
                                  std::to_string(tensor->device.device_type));
    }
    const DType dtype = from_dlpack_dtype(tensor->dtype);
    std::vector<int64_t> shape(tensor->shape, tensor->shape + tensor->ndim);
    check_shape(shape);
    std::vector<int64_t> strides = tensor->strides != nullptr
                                       ? std::vector<int64_t>(tensor->strides, tensor->strides + tensor->ndim)
                                       : contiguous_strides(shape);
    const auto address = reinterpret_cast<std::uintptr_t>(tensor->data) + tensor->byte_offset;
    return DeviceArray(owner, address, shape, strides, dtype, tensor->device.device_id);
  }

  // --- __cuda_array_interface__ (version 3) ----------------------------------------------------------------------
  py::dict cuda_array_interface() const {
    py::dict interface;
    interface["shape"] = py::tuple(py::cast(shape_));
    interface["typestr"] = typestr_of(dtype_);
    interface["data"] = py::make_tuple(address_, false);
    interface["version"] = 3;
    if (is_contiguous()) {
      interface["strides"] = py::none();
    } else {
      std::vector<int64_t> byte_strides;
      for (int64_t stride : strides_) byte_strides.push_back(stride * static_cast<int64_t>(dtype_size(dtype_)));
      interface["strides"] = py::tuple(py::cast(byte_strides));
    }
    interface["stream"] = py::none();  // GE2 work is ordered on the stream the caller passed; no sync implied
    return interface;
  }

  static DeviceArray from_cuda_array_interface(py::object source) {
    py::dict interface = source.attr("__cuda_array_interface__");
    const auto shape = interface["shape"].cast<std::vector<int64_t>>();
    check_shape(shape);
    const DType dtype = dtype_from_typestr(interface["typestr"].cast<std::string>());
    const auto data = interface["data"].cast<py::tuple>();
    const auto address = data[0].cast<std::uintptr_t>();
    std::vector<int64_t> strides = contiguous_strides(shape);
    if (interface.contains("strides") && !interface["strides"].is_none()) {
      const auto byte_strides = interface["strides"].cast<std::vector<int64_t>>();
      const auto itemsize = static_cast<int64_t>(dtype_size(dtype));
      for (std::size_t i = 0; i < byte_strides.size(); ++i) {
        if (byte_strides[i] % itemsize != 0) {
          throw std::invalid_argument("__cuda_array_interface__: stride " + std::to_string(byte_strides[i]) +
                                      " is not a multiple of the item size " + std::to_string(itemsize));
        }
        strides[i] = byte_strides[i] / itemsize;
      }
    }
    int device = 0;
    if (address != 0) {
      cudaPointerAttributes attributes{};
      GE2_CUDA_CHECK(cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(address)));
      if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
        throw std::invalid_argument("__cuda_array_interface__: data pointer is not device memory");
      }
      device = attributes.device;
    }
    return DeviceArray(keep_alive(source), address, shape, strides, dtype, device);
  }

  // --- accessors -----------------------------------------------------------------------------------------------
  void* pointer() const { return reinterpret_cast<void*>(address_); }
  std::uintptr_t address() const { return address_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  DType dtype() const { return dtype_; }
  int device() const { return device_; }
  int64_t size() const {
    int64_t count = 1;
    for (int64_t extent : shape_) count *= extent;
    return count;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(size()) * dtype_size(dtype_); }
  bool is_contiguous() const { return strides_ == contiguous_strides(shape_) || size() <= 1; }

  std::string repr() const {
    return "DeviceArray(shape=" + shape_string(shape_) + ", dtype=" + dtype_name(dtype_) + ", device=cuda:" +
           std::to_string(device_) + (is_contiguous() ? ")" : ", strided)");
  }

 private:
  // Plain string building, no iostreams: a module that carries its own copy of the iostream/locale code crashed
  // in std::ostream on the GPU machine (its locale facets came from the process's other libstdc++).
  static std::string shape_string(const std::vector<int64_t>& shape) {
    std::string text = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + (shape.size() == 1 ? ",)" : ")");
  }
  static cudaStream_t as_stream(std::uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }
  void require_contiguous(const char* what) const {
    if (!is_contiguous()) throw std::invalid_argument(std::string(what) + ": needs a contiguous DeviceArray");
  }

  std::shared_ptr<void> storage_;
  std::uintptr_t address_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  DType dtype_;
  int device_;
};

bool read_device_array(py::handle object, ArrayFields& fields) {
  if (!py::isinstance<DeviceArray>(object)) return false;
  const auto& array = object.cast<const DeviceArray&>();
  fields.address = array.address();
  fields.shape = &array.shape();
  fields.strides = &array.strides();
  fields.dtype = static_cast<int>(array.dtype());
  fields.device = array.device();
  return true;
}

void register_device_array(py::module_& m) {
  py::class_<DeviceArray>(m, "DeviceArray",
                          "An n-d array in CUDA device memory. Owns its memory, or borrows it zero-copy from "
                          "PyTorch/CuPy through DLPack or __cuda_array_interface__.")
      .def_static("empty", &DeviceArray::empty, py::arg("shape"), py::arg("dtype") = "float32",
                  py::arg("device") = kCurrentDevice, "Uninitialized array on `device` (default: the current one).")
      .def_static("from_numpy", &DeviceArray::from_numpy, py::arg("array"), py::arg("device") = kCurrentDevice,
                  py::arg("stream") = 0, "Copies a host array to the device (bfloat16: ml_dtypes.bfloat16).")
      .def_static("from_dlpack_capsule", &DeviceArray::from_dlpack_capsule, py::arg("capsule"),
                  "Borrows the memory behind a DLPack capsule (zero-copy); the capsule is consumed.")
      .def_static("from_cuda_array_interface", &DeviceArray::from_cuda_array_interface, py::arg("obj"),
                  "Borrows the memory of an object exposing __cuda_array_interface__ (zero-copy).")
      .def("numpy", &DeviceArray::numpy, py::arg("stream") = 0, "Copies to a new host array (synchronizes).")
      .def("copy_from_numpy", &DeviceArray::copy_from_host, py::arg("array"), py::arg("stream") = 0,
           "Overwrites the contents with a host array of the same shape and dtype.")
      .def("poison", &DeviceArray::poison, py::arg("stream") = 0, "Fills with NaN (all bits set).")
      .def("zero", &DeviceArray::zero, py::arg("stream") = 0, "Fills with zeros.")
      .def("reshape", &DeviceArray::reshape, py::arg("shape"), "A view with another shape (contiguous only).")
      .def("view", &DeviceArray::view, py::arg("offset"), py::arg("shape"), py::arg("dtype"),
           "A contiguous view of another shape and dtype over the bytes from `offset` (sharing the memory).")
      .def(
          "__dlpack__",
          [](const DeviceArray& self, py::object stream, py::object max_version, py::object dl_device,
             py::object copy) {
            if (!copy.is_none() && copy.cast<bool>()) {
              throw std::invalid_argument("__dlpack__: copy=True is not supported; GE2 exports views only");
            }
            if (!dl_device.is_none()) {
              auto requested = dl_device.cast<std::pair<int, int>>();
              if (requested.first != dlpack::kCUDA || requested.second != self.device()) {
                throw std::invalid_argument("__dlpack__: dl_device must be the array's own device");
              }
            }
            // Work GE2 enqueued on other streams is the caller's to order; the stream argument is accepted
            // as the protocol requires.
            (void)stream;
            const bool versioned =
                !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
            return self.to_dlpack(versioned);
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__",
           [](const DeviceArray& self) { return py::make_tuple(static_cast<int>(dlpack::kCUDA), self.device()); })
      .def_property_readonly("__cuda_array_interface__", &DeviceArray::cuda_array_interface)
      .def(
          "view_tuple",
          [](const DeviceArray& self) {
            return py::make_tuple(self.address(), py::tuple(py::cast(self.shape())), dtype_name(self.dtype()),
                                  py::tuple(py::cast(self.strides())), self.device(), self.is_contiguous());
          },
          "(ptr, shape, dtype, strides, device, contiguous) in one call: what op launchers need, cheaply.")
      .def_property_readonly("ptr", &DeviceArray::address, "Device address of the first element.")
      .def_property_readonly("shape", [](const DeviceArray& self) { return py::tuple(py::cast(self.shape())); })
      .def_property_readonly("strides",
                             [](const DeviceArray& self) { return py::tuple(py::cast(self.strides())); },
                             "Strides in elements.")
      .def_property_readonly("dtype", [](const DeviceArray& self) { return std::string(dtype_name(self.dtype())); })
      .def_property_readonly("device", &DeviceArray::device)
      .def_property_readonly("size", &DeviceArray::size)
      .def_property_readonly("ndim", [](const DeviceArray& self) { return self.shape().size(); })
      .def_property_readonly("nbytes", &DeviceArray::nbytes)
      .def_property_readonly("itemsize", [](const DeviceArray& self) { return dtype_size(self.dtype()); })
      .def_property_readonly("is_contiguous", &DeviceArray::is_contiguous)
      .def("__len__",
           [](const DeviceArray& self) {
             if (self.shape().empty()) throw py::type_error("len() of a 0-d DeviceArray");
             return self.shape()[0];
           })
      .def("__repr__", &DeviceArray::repr);

  m.def("pinned_empty", &pinned_empty, py::arg("nbytes"),
        "A uint8 host array in page-locked memory: graph memcpy nodes copy to and from it (not pageable memory).");
  m.def(
      "memcpy_device_to_device",
      [](std::uintptr_t destination, std::uintptr_t source, std::size_t nbytes, std::uintptr_t stream) {
        GE2_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(destination), reinterpret_cast<void*>(source),
                                       nbytes, cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(stream)));
      },
      py::arg("destination"), py::arg("source"), py::arg("nbytes"), py::arg("stream") = 0);
  m.def(
      "memset",
      [](std::uintptr_t destination, int value, std::size_t nbytes, std::uintptr_t stream) {
        GE2_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(destination), value, nbytes,
                                       reinterpret_cast<cudaStream_t>(stream)));
      },
      py::arg("destination"), py::arg("value"), py::arg("nbytes"), py::arg("stream") = 0);
}

}  // namespace ge2::runtime
