// A launch an op module hands the runtime as a C function (a capsule named kCLaunchCapsule): a candidate's launch
// with its problem's arguments converted once, at prepare time, so a call costs the op's C++ alone, with no Python
// argument conversion. The runtime's Launch (src/runtime/launch.cpp) calls it with the call's addresses, the GIL
// released. Only C types cross the module boundary: each module links its own C++ runtime (AddStandaloneOp.cmake).
#pragma once
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

extern "C" {
struct Ge2CLaunch {
  // 0 when the work is enqueued; otherwise kCLaunchBadArgument (a ValueError) or kCLaunchFailed (a RuntimeError),
  // with the message in `error`.
  int (*call)(void* state, const std::uintptr_t* inputs, const std::uintptr_t* outputs, std::uintptr_t stream,
              char* error, std::size_t error_size);
  void (*destroy)(void* state);
  void* state;
  int inputs, outputs;  // how many addresses of each `call` reads
};
}

namespace ge2::binding {

constexpr const char* kCLaunchCapsule = "ge2.c_launch";
constexpr int kCLaunchBadArgument = 1;
constexpr int kCLaunchFailed = 2;

// body(state, inputs, outputs, stream) enqueues the work; `state` holds what the op's binding converted once.
template <typename State>
using CLaunchBody = void (*)(State& state, const std::uintptr_t* inputs, const std::uintptr_t* outputs,
                             cudaStream_t stream);

// The capsule of a C launch running `body` on `state`, reading `inputs` input and `outputs` output addresses (the
// body fills the addresses into a copy of what it needs: one launch may run on several threads at once).
template <typename State>
pybind11::object make_c_launch(State state, int inputs, int outputs, CLaunchBody<State> body) {
  struct Holder {
    State state;
    CLaunchBody<State> body;
  };
  auto* launch = new Ge2CLaunch;
  launch->state = new Holder{std::move(state), body};
  launch->inputs = inputs;
  launch->outputs = outputs;
  launch->call = [](void* raw, const std::uintptr_t* inputs, const std::uintptr_t* outputs, std::uintptr_t stream,
                    char* error, std::size_t error_size) -> int {
    auto* holder = static_cast<Holder*>(raw);
    const auto report = [&](const char* message, int code) {
      std::strncpy(error, message, error_size - 1);
      error[error_size - 1] = '\0';
      return code;
    };
    try {
      holder->body(holder->state, inputs, outputs, reinterpret_cast<cudaStream_t>(stream));
      return 0;
    } catch (const std::invalid_argument& failure) {
      return report(failure.what(), kCLaunchBadArgument);
    } catch (const std::exception& failure) {
      return report(failure.what(), kCLaunchFailed);
    } catch (...) {
      return report("unknown C++ exception", kCLaunchFailed);
    }
  };
  launch->destroy = [](void* raw) { delete static_cast<Holder*>(raw); };
  PyObject* capsule = PyCapsule_New(launch, kCLaunchCapsule, [](PyObject* self) {
    auto* owned = static_cast<Ge2CLaunch*>(PyCapsule_GetPointer(self, kCLaunchCapsule));
    owned->destroy(owned->state);
    delete owned;
  });
  if (capsule == nullptr) {
    launch->destroy(launch->state);
    delete launch;
    throw pybind11::error_already_set();
  }
  return pybind11::reinterpret_steal<pybind11::object>(capsule);
}

}  // namespace ge2::binding
