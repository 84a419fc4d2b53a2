// Whether this op module was built with CUTLASS's sm_90a kernels, as CMake's ge2_use_cutlass (cmake/Cutlass.cmake)
// decided for it: GE2_WITH_CUTLASS, and GE2_CUTLASS_NOT_BUILT_REASON when it is 0.
#pragma once
#include <string>

namespace ge2 {

// Empty when the module's CUTLASS candidates are built, else why not (for kernels() and the capability checks).
inline std::string cutlass_not_built_reason() {
#if GE2_WITH_CUTLASS
  return "";
#else
  return GE2_CUTLASS_NOT_BUILT_REASON;
#endif
}

}  // namespace ge2
