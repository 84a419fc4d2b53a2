// Whether this op module was built with cuDNN's graph API (the cuDNN frontend headers), as CMake's
// ge2_use_cudnn (cmake/Cudnn.cmake) decided: GE2_WITH_CUDNN and GE2_WITH_CUDNN_FRONTEND.
#pragma once
#include <string>

namespace ge2 {

// Empty when the cuDNN frontend candidates are built, else why not (for kernels() and the capability checks).
inline std::string cudnn_frontend_not_built_reason() {
#if GE2_WITH_CUDNN_FRONTEND
  return "";
#elif GE2_WITH_CUDNN
  return "cuDNN frontend headers not found (install nvidia-cudnn-frontend or set GE2_CUDNN_FRONTEND_DIR)";
#else
  return "CMake found no cuDNN (cudnn.h and libcudnn: neither in the CUDA toolkit nor in the nvidia-cudnn-cu13 "
         "Python package)";
#endif
}

}  // namespace ge2
