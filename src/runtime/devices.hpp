// The device functions of _runtime (devices.cpp): device count and checks, the current device, DeviceGuard. Every
// other unit of _runtime may use them; they use none of those units.
#pragma once
#include <pybind11/pybind11.h>

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

// device_count, current_device, set_device, device_properties, memory_info, synchronize, the versions.
void register_devices(py::module_& module);

}  // namespace ge2::runtime
