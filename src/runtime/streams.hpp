// Streams, events and CUDA graph capture (streams.cpp).
#pragma once
#include <pybind11/pybind11.h>

namespace ge2::runtime {

// The Stream, Event and CudaGraph classes and the NVTX ranges.
void register_streams(pybind11::module_& module);

}  // namespace ge2::runtime
