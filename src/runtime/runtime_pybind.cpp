// The _runtime module: registers the device functions (devices.cpp), DeviceArray (device_array.cpp), streams,
// events and graph capture (streams.cpp) and the op faces' native call path (launch.cpp).
#include "device_array.hpp"
#include "devices.hpp"
#include "launch.hpp"
#include "streams.hpp"

PYBIND11_MODULE(_runtime, m) {
  m.doc() = "GE2 native runtime: devices, DeviceArray, streams, events, memory, CUDA graph capture, op launches";
  ge2::runtime::register_devices(m);
  ge2::runtime::register_device_array(m);
  ge2::runtime::register_streams(m);
  ge2::runtime::register_launch(m);
}
