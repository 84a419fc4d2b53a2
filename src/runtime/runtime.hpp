// _runtime: devices, DeviceArray, streams, events, memory and CUDA graph capture.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include "status.hpp"

namespace ge2::runtime {

namespace py = pybind11;

// Number of visible CUDA devices; 0 (never an error) on a machine with no GPU or driver.
int device_count();

// Raises RuntimeError with the driver's reason when no GPU can be used, and ValueError for a bad index.
void require_device(int device);

// The `device` argument's default: the calling thread's current device (cudaSetDevice, ge2.device.set_device), so
// that a process driving GPU LOCAL_RANK allocates there without naming it.
constexpr int kCurrentDevice = -1;

// `device`, or the current device for kCurrentDevice; raises like require_device for a bad index.
int resolve_device(int device);

// Makes `device` current for the scope and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// CudaGraph brackets its captures with these. cudaFree is not allowed while the calling thread captures (it would
// invalidate the capture, and the thread would stay capturing), so DeviceArray memory released on this thread
// meanwhile (a dropped array, or one Python's garbage collector finds) is freed when the thread's last capture ends.
void capture_begins();
void capture_ends();

// What an op launch needs of a DeviceArray, read without a Python call (the op faces' native call path).
struct ArrayFields {
  std::uintptr_t address = 0;
  const std::vector<int64_t>* shape = nullptr;
  const std::vector<int64_t>* strides = nullptr;
  int dtype = 0;
  int device = 0;
};
// True, with its fields, when `object` is a DeviceArray.
bool read_device_array(py::handle object, ArrayFields& fields);

void register_devices(py::module_& module);
void register_device_array(py::module_& module);
void register_streams(py::module_& module);
void register_launch(py::module_& module);

}  // namespace ge2::runtime
