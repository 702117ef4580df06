// Integer arithmetic shared by host and device code: the high word of a 32-bit product, and division
// by a divisor fixed for a whole launch as a multiply-high and a shift.
//
// FastDivide (Granlund and Montgomery, "Division by invariant integers using multiplication", PLDI
// 1994): for 2 <= d < 2^31, l = ceil(log2 d) and m = ceil(2^(31 + l) / d) < 2^32, floor(n / d) =
// floor(n m / 2^(31 + l)) for every 0 <= n < 2^31, since m d - 2^(31 + l) < d <= 2^l. A kernel that
// splits a row index into (batch, head, query) per row pays a few instructions instead of the
// twenty-odd of each integer division.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define FUSEKIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FUSEKIT_HOST_DEVICE inline
#endif

namespace fusekit::kernels {

FUSEKIT_HOST_DEVICE uint32_t multiply_high32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// n / divisor for 0 <= n < 2^31.
struct FastDivide {
  int divisor = 1;
  uint32_t multiplier = 0;  // 0: the divisor is 1
  uint32_t shift = 0;

  FastDivide() = default;
  explicit FastDivide(int d) : divisor(d) {
    if (d < 1) throw std::invalid_argument("FastDivide: the divisor must be >= 1 (got " + std::to_string(d) + ")");
    if (d == 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < static_cast<uint64_t>(d)) ++l;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    shift = l - 1;
  }
  FUSEKIT_HOST_DEVICE int quotient(int n) const {
    return multiplier == 0 ? n : static_cast<int>(multiply_high32(static_cast<uint32_t>(n), multiplier) >> shift);
  }
};

}  // namespace fusekit::kernels
