// Division by a divisor that is fixed for a whole launch (tensor extents, slice steps), for index arithmetic in
// data-movement kernels. A 32-bit index divides with a multiply-high and a shift (Granlund & Montgomery, the form
// PyTorch's IntDivider uses): a few instructions instead of the ~20 of an integer division. A 64-bit index (tensors
// of 2^31 elements or more) divides plainly.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace ge2 {

struct FastDivmod {
  int64_t divisor = 1;
  uint32_t multiplier = 0;  // the magic numbers are meaningful when divisor < 2^31
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(int64_t d) : divisor(d) {
    if (d < 1 || d >= (int64_t{1} << 31)) return;  // only the 64-bit path may see such a divisor
    while (shift < 32 && (uint64_t{1} << shift) < static_cast<uint64_t>(d)) ++shift;
    // 2^32 * (2^shift - d) / d + 1 < 2^32 because 2^(shift-1) < d <= 2^shift.
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // Quotient of n; a 32-bit n must be < 2^31 (so that t + n cannot overflow).
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, multiplier);
#else
    const uint32_t t = static_cast<uint32_t>((static_cast<uint64_t>(n) * multiplier) >> 32);
#endif
    return (t + n) >> shift;
  }
  __host__ __device__ __forceinline__ uint64_t div(uint64_t n) const { return n / static_cast<uint64_t>(divisor); }

  // Returns the quotient and stores the remainder.
  template <typename Index>
  __host__ __device__ __forceinline__ Index divmod(Index n, Index& remainder) const {
    const Index quotient = div(n);
    remainder = n - quotient * static_cast<Index>(divisor);
    return quotient;
  }
};

}  // namespace ge2
