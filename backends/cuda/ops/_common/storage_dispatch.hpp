// Host-side dispatch for bandwidth-bound kernels: binds the storage type of a floating dtype and the access width
// (16-byte vectors when the data allows them, scalars otherwise) as compile-time constants of one generic lambda,
// so a launcher writes its launch once instead of once per (type, width) pair.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "dtype.hpp"
#include "vector_access.hpp"

namespace ge2 {

template <int kValue>
using Constant = std::integral_constant<int, kValue>;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls launch(TypeTag<T>, Constant<kPack>) with T the storage type of `dtype` and kPack its 16-byte vector width
// (kPackSize<T>) when every contiguous run the kernel vectorizes is a multiple of it (`run` elements) and every
// pointer is 16-byte aligned; kPack = 1 otherwise. A non-floating dtype is a std::invalid_argument naming "dtype".
template <typename Launch>
void dispatch_storage(DType dtype, int64_t run, bool pointers_aligned, Launch&& launch) {
  GE2_DISPATCH_FLOATING(dtype, "dtype", {
    if (pointers_aligned && run % kPackSize<scalar_t> == 0) {
      launch(TypeTag<scalar_t>{}, Constant<kPackSize<scalar_t>>{});
    } else {
      launch(TypeTag<scalar_t>{}, Constant<1>{});
    }
  });
}

}  // namespace ge2
