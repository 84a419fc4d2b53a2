// DeviceArray (device_array.cpp): what the other units of _runtime use of it.
#pragma once
#include <cstdint>
#include <vector>

#include <pybind11/pybind11.h>

namespace ge2::runtime {

namespace py = pybind11;

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

// The DeviceArray class.
void register_device_array(py::module_& module);

}  // namespace ge2::runtime
