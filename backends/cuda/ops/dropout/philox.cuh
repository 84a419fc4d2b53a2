// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), a counter-based generator:
// four 32-bit words out of a 128-bit counter and a 64-bit key, with no state. Checked against Random123's
// published known-answer vectors (tests/test_dropout.py reproduces it in NumPy and checks both).
//
// Dropout's mask: element e = offset + i uses word e % 4 of philox(counter = (e / 4 as two 32-bit words, 0, 0),
// key = (seed low, seed high)) and is kept when that word < keep_threshold(p). It depends only on (seed, offset, i),
// never on the launch shape.
#pragma once
#include <cmath>
#include <cstdint>

namespace ge2::dropout {

struct PhiloxWords {
  uint32_t w[4];
};

// The high and low 32 bits of a * b. On the device as two 32-bit multiplies: written as one 64-bit product, the
// compiler widens the whole round to 64-bit arithmetic.
__host__ __device__ __forceinline__ void multiply_high_low(uint32_t a, uint32_t b, uint32_t& high, uint32_t& low) {
#ifdef __CUDA_ARCH__
  high = __umulhi(a, b);
  low = a * b;
#else
  const uint64_t product = static_cast<uint64_t>(a) * b;
  high = static_cast<uint32_t>(product >> 32);
  low = static_cast<uint32_t>(product);
#endif
}

__host__ __device__ __forceinline__ PhiloxWords philox4x32_10(PhiloxWords counter, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
  uint32_t c0 = counter.w[0], c1 = counter.w[1], c2 = counter.w[2], c3 = counter.w[3];
  for (int round = 0; round < 10; ++round) {  // fully unrolled by nvcc (a constant trip count)
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    uint32_t high0, low0, high1, low1;
    multiply_high_low(kMul0, c0, high0, low0);
    multiply_high_low(kMul1, c2, high1, low1);
    c0 = high1 ^ c1 ^ k0;
    c1 = low1;
    c2 = high0 ^ c3 ^ k1;
    c3 = low0;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// The words for element group `group` (elements 4 * group ... 4 * group + 3) under `seed`.
__host__ __device__ __forceinline__ PhiloxWords dropout_words(uint64_t group, uint64_t seed) {
  return philox4x32_10(PhiloxWords{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), 0u, 0u}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// An element is kept when its word < threshold = floor((1 - p) * 2^32) (2^32 at p = 0: always kept). Computed in
// double on the host, exactly as the NumPy reference does.
inline uint64_t keep_threshold(double p) { return static_cast<uint64_t>(std::floor((1.0 - p) * 4294967296.0)); }

}  // namespace ge2::dropout
