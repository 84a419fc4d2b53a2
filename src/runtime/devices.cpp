// The device functions of _runtime: device count and checks, the current device, DeviceGuard, properties,
// memory info and synchronization. Streams, arrays and launches use them; nothing here uses those.
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "devices.hpp"
#include "status.hpp"

namespace ge2::runtime {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void require_device(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw std::runtime_error(std::string("ge2: no CUDA device is available (") +
                             (status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0") + ")");
  }
  if (device < 0 || device >= count) {
    throw std::invalid_argument("device: expected an index in [0, " + std::to_string(count) + "), got " +
                                std::to_string(device));
  }
}

int resolve_device(int device) {
  if (device == kCurrentDevice) {
    require_device(0);
    GE2_CUDA_CHECK(cudaGetDevice(&device));
  }
  require_device(device);
  return device;
}

DeviceGuard::DeviceGuard(int device) {
  device = resolve_device(device);
  GE2_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) GE2_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

void register_devices(py::module_& m) {
  m.def("device_count", &device_count, "Number of visible CUDA devices (0 when there is no GPU or driver).");
  m.def(
      "current_device",
      [] {
        require_device(0);
        int device = 0;
        GE2_CUDA_CHECK(cudaGetDevice(&device));
        return device;
      },
      "Index of the current CUDA device.");
  m.def(
      "set_device",
      [](int device) {
        require_device(device);
        GE2_CUDA_CHECK(cudaSetDevice(device));
      },
      py::arg("device"));
  m.def(
      "device_properties",
      [](int device) {
        device = resolve_device(device);
        cudaDeviceProp prop{};
        GE2_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        py::dict info;
        info["index"] = device;
        info["name"] = std::string(prop.name);
        info["compute_capability"] = py::make_tuple(prop.major, prop.minor);
        info["sm_count"] = prop.multiProcessorCount;
        info["total_memory"] = static_cast<std::size_t>(prop.totalGlobalMem);
        info["l2_cache_bytes"] = prop.l2CacheSize;
        info["shared_memory_per_block_optin"] = static_cast<std::size_t>(prop.sharedMemPerBlockOptin);
        // What a roofline needs (runtime/roofline.py): peak clocks and the memory bus. CUDA 13 dropped these from
        // cudaDeviceProp; the attributes give them on every version.
        const auto attribute = [device](cudaDeviceAttr which) {
          int value = 0;
          GE2_CUDA_CHECK(cudaDeviceGetAttribute(&value, which, device));
          return value;
        };
        info["clock_rate_khz"] = attribute(cudaDevAttrClockRate);
        info["memory_clock_rate_khz"] = attribute(cudaDevAttrMemoryClockRate);
        info["memory_bus_width_bits"] = attribute(cudaDevAttrGlobalMemoryBusWidth);
        return info;
      },
      py::arg("device") = kCurrentDevice,
      "Name, compute capability, SM count, clocks, memory bus, memory and cache sizes of a device.");
  m.def(
      "memory_info",
      [](int device) {
        DeviceGuard guard(device);
        std::size_t free_bytes = 0, total_bytes = 0;
        GE2_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        return py::make_tuple(free_bytes, total_bytes);
      },
      py::arg("device") = kCurrentDevice, "(free, total) device memory in bytes.");
  m.def(
      "synchronize",
      [](int device) {
        DeviceGuard guard(device);
        py::gil_scoped_release release;
        GE2_CUDA_CHECK(cudaDeviceSynchronize());
      },
      py::arg("device") = kCurrentDevice, "Waits for all work on the device.");
  m.def("runtime_version", [] {
    int version = 0;
    GE2_CUDA_CHECK(cudaRuntimeGetVersion(&version));
    return version;
  });
  m.def("driver_version", [] {
    int version = 0;
    cudaDriverGetVersion(&version);  // 0 when no driver is installed
    return version;
  });
}

}  // namespace ge2::runtime
