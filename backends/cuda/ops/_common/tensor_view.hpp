// A non-owning view of device memory: pointer, dtype, shape and strides (in elements). Op launchers take these
// (or plain pointers plus sizes); they never own long-lived memory.
#pragma once
#include <cstdint>

#include "dtype.hpp"

namespace ge2 {

constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::Float32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
};

}  // namespace ge2
