// The op faces' native call path (launch.cpp).
#pragma once
#include <pybind11/pybind11.h>

namespace ge2::runtime {

// The Launch, PreparedCall and LaunchSlot types and prepared_call.
void register_launch(pybind11::module_& module);

}  // namespace ge2::runtime
