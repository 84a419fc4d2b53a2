// _codegen: compiles generated CUDA C++ with NVRTC, loads the cubin and hands the runtime a C launch of it.
//
// The generated kernels (python/graph_executor_v2/codegen) take their arguments as device pointers only, inputs
// first, then outputs: shapes, strides and constants are folded into the source. So one launch needs the kernel, its
// grid and block, and the call's addresses: a C launch (c_launch.hpp) that the runtime's Launch calls with no
// Python in between, capturable in CUDA graphs like every op's launch.
//
// Loading uses the runtime API's context-independent libraries (cudaLibraryLoadData / cudaLibraryGetKernel /
// cudaLaunchKernel), the runtime's own equivalent of cuModuleLoadData / cuModuleGetFunction / cuLaunchKernel: the
// module links the shared CUDA runtime like every op and needs no libcuda at link or import time, so compiling
// works on a machine with no driver (tests, CI) and only loading and launching need a GPU.
#include <dlfcn.h>
#include <nvrtc.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "c_launch.hpp"

namespace py = pybind11;

namespace {

// A program's log; empty when NVRTC wrote none.
std::string program_log(nvrtcProgram program) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size <= 1) return "";
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return "";
  log.resize(size - 1);  // the trailing NUL
  return log;
}

struct ProgramGuard {
  nvrtcProgram program = nullptr;
  ~ProgramGuard() {
    if (program != nullptr) nvrtcDestroyProgram(&program);
  }
};

[[noreturn]] void nvrtc_failed(const char* call, nvrtcResult result, const std::string& log) {
  std::string message = std::string("NVRTC ") + call + " failed: " + nvrtcGetErrorString(result);
  if (!log.empty()) message += "\n" + log;
  throw std::runtime_error(message);
}

std::pair<int, int> loaded_nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcResult result = nvrtcVersion(&major, &minor);
  if (result != NVRTC_SUCCESS) nvrtc_failed("nvrtcVersion", result, "");
  return {major, minor};
}

// Compiles `source` (file name `name` in the log) to a cubin for sm_<arch>; returns (cubin, log). RuntimeError with
// NVRTC's log when the source does not compile.
py::tuple compile(const std::string& source, const std::string& name, int arch, const std::vector<std::string>& options) {
  if (arch < 50 || arch > 1000) throw std::invalid_argument("arch: expected a compute capability as 10*major+minor "
                                                            "(e.g. 90), got " + std::to_string(arch));
  std::vector<std::string> all_options = {"--gpu-architecture=sm_" + std::to_string(arch), "-std=c++17"};
  // NVRTC 12.9+ takes a cubin from the driver's compute cache when it has one (only where a driver is installed),
  // skipping ptxas: the log then lacks ptxas's report (--ptxas-options=-v) and its warnings. GE2 caches cubins
  // itself (codegen/compiler.py), so NVRTC's cache is off and every compile runs ptxas and returns its whole log.
  // The check is on the library loaded at run time (the PyPI wheel's may differ from the headers').
  const auto [major, minor] = loaded_nvrtc_version();
  if (major > 12 || (major == 12 && minor >= 9)) all_options.push_back("--no-cache");
  all_options.insert(all_options.end(), options.begin(), options.end());
  std::vector<const char*> option_pointers;
  for (const auto& option : all_options) option_pointers.push_back(option.c_str());
  std::string log, cubin;
  const char* failed_call = nullptr;
  nvrtcResult result = NVRTC_SUCCESS;
  {
    py::gil_scoped_release release;  // NVRTC takes tens of milliseconds: other threads may run meanwhile
    ProgramGuard guard;
    result = nvrtcCreateProgram(&guard.program, source.c_str(), name.c_str(), 0, nullptr, nullptr);
    failed_call = "nvrtcCreateProgram";
    if (result == NVRTC_SUCCESS) {
      result = nvrtcCompileProgram(guard.program, static_cast<int>(option_pointers.size()), option_pointers.data());
      failed_call = "compilation";
      log = program_log(guard.program);
    }
    if (result == NVRTC_SUCCESS) {
      std::size_t size = 0;
      result = nvrtcGetCUBINSize(guard.program, &size);
      failed_call = "nvrtcGetCUBIN";
      if (result == NVRTC_SUCCESS) {
        cubin.resize(size);
        result = nvrtcGetCUBIN(guard.program, cubin.data());
      }
    }
  }
  if (result != NVRTC_SUCCESS) nvrtc_failed(failed_call, result, log);
  return py::make_tuple(py::bytes(cubin), log);
}

py::tuple nvrtc_version() {
  const auto [major, minor] = loaded_nvrtc_version();
  return py::make_tuple(major, minor);
}

// The path of the NVRTC library this process loaded (the toolkit's, or the PyPI wheel's preloaded by
// codegen/compiler.py); "" when the loader cannot say.
std::string nvrtc_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // a failed load is not sticky: clear it so the next launch does not report it
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}

// A loaded cubin and one kernel of it; unloaded when the last launch bound to it is gone.
class Library {
 public:
  Library(const std::string& cubin, const std::string& kernel_name) : kernel_name_(kernel_name) {
    check_cuda(cudaLibraryLoadData(&library_, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
               "cudaLibraryLoadData (loading a generated kernel)");
    cudaError_t status = cudaLibraryGetKernel(&kernel_, library_, kernel_name.c_str());
    if (status == cudaSuccess) {
      // Loads the kernel into the current context now (with lazy module loading it would load at its first
      // launch, which may be inside a CUDA-graph capture), and reports a bad cubin here, at plan build.
      cudaFuncAttributes attributes{};
      status = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel_));
    }
    if (status != cudaSuccess) {
      cudaLibraryUnload(library_);
      check_cuda(status, ("loading kernel '" + kernel_name + "'").c_str());
    }
  }
  ~Library() { cudaLibraryUnload(library_); }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  cudaKernel_t kernel() const { return kernel_; }
  const std::string& kernel_name() const { return kernel_name_; }

 private:
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t kernel_ = nullptr;
  std::string kernel_name_;
};

struct LaunchState {
  std::shared_ptr<Library> library;
  unsigned grid = 0, block = 0, shared_bytes = 0;
  int inputs = 0, outputs = 0;
};

// One launch: the addresses in a local array of parameters (a launch may run on several threads at once).
void launch_body(LaunchState& state, const std::uintptr_t* inputs, const std::uintptr_t* outputs,
                 cudaStream_t stream) {
  if (state.grid == 0) return;  // an empty tensor: nothing to do, no launch
  const int count = state.inputs + state.outputs;
  constexpr int kMaxOnStack = 64;
  std::uintptr_t values[kMaxOnStack];
  void* parameters[kMaxOnStack];
  for (int i = 0; i < state.inputs; ++i) values[i] = inputs[i];
  for (int i = 0; i < state.outputs; ++i) values[state.inputs + i] = outputs[i];
  for (int i = 0; i < count; ++i) {
    if (values[i] == 0) throw std::invalid_argument("generated kernel '" + state.library->kernel_name() +
                                                    "': address " + std::to_string(i) + " is null");
    parameters[i] = &values[i];
  }
  cudaError_t status = cudaLaunchKernel(reinterpret_cast<const void*>(state.library->kernel()), dim3(state.grid),
                                        dim3(state.block), parameters, state.shared_bytes, stream);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("generated kernel '" + state.library->kernel_name() + "': launch failed: " +
                             cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
  }
}

class Kernel {
 public:
  Kernel(py::bytes cubin, const std::string& name) {
    std::string code = cubin;
    py::gil_scoped_release release;
    library_ = std::make_shared<Library>(code, name);
  }

  // The C launch of this kernel over `inputs` then `outputs` addresses, on a 1-d grid.
  py::object bind(int inputs, int outputs, unsigned grid, unsigned block, unsigned shared_bytes) const {
    if (inputs < 0 || outputs < 1 || inputs + outputs > 64) {
      throw std::invalid_argument("inputs, outputs: expected 0..63 inputs and 1..64 outputs, 64 in all, got " +
                                  std::to_string(inputs) + " and " + std::to_string(outputs));
    }
    if (block == 0 || block > 1024) throw std::invalid_argument("block: expected 1..1024, got " + std::to_string(block));
    LaunchState state{library_, grid, block, shared_bytes, inputs, outputs};
    return ge2::binding::make_c_launch<LaunchState>(std::move(state), inputs, outputs, launch_body);
  }

 private:
  std::shared_ptr<Library> library_;
};

}  // namespace

PYBIND11_MODULE(_codegen, m) {
  m.doc() = "NVRTC compilation and loading of GE2's generated kernels";
  m.def("compile", &compile, py::arg("source"), py::arg("name"), py::arg("arch"), py::arg("options"),
        "Compiles CUDA C++ to a cubin for sm_<arch>: (cubin bytes, log). RuntimeError with the log on failure.");
  m.def("nvrtc_version", &nvrtc_version, "NVRTC's (major, minor) version");
  m.def("nvrtc_library", &nvrtc_library, "The path of the loaded NVRTC library (\"\" when unknown)");
  py::class_<Kernel>(m, "Kernel")
      .def(py::init<py::bytes, const std::string&>(), py::arg("cubin"), py::arg("name"),
           "Loads a cubin (on every device, lazily) and finds its kernel `name`")
      .def("bind", &Kernel::bind, py::arg("inputs"), py::arg("outputs"), py::arg("grid"), py::arg("block"),
           py::arg("shared_bytes") = 0, "The C launch of the kernel for _runtime.Launch");
}
