// FastDivide against the hardware's division: every divisor up to 4096 and every power of two and
// its neighbours up to 2^31 - 1, each on the dividends at the ends of the range, around multiples
// of the divisor and on random ones.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/detail/fast_divide.h"

namespace fusekit::kernels {
namespace {

size_t wrong_quotients(int d, std::mt19937_64& rng) {
  const FastDivide divide(d);
  std::vector<int64_t> n = {0, 1, 2, INT_MAX, INT_MAX - 1, INT_MAX - d};
  for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{1000}, int64_t{INT_MAX} / d}) {
    for (int64_t delta : {-1, 0, 1}) n.push_back(k * d + delta);
  }
  std::uniform_int_distribution<int> any(0, INT_MAX);
  for (int i = 0; i < 64; ++i) n.push_back(any(rng));
  size_t wrong = 0;
  for (int64_t v : n) {
    if (v < 0 || v > INT_MAX) continue;
    const int x = static_cast<int>(v);
    if (divide.quotient(x) != x / d) ++wrong;
  }
  return wrong;
}

TEST(FastDivide, QuotientsMatchIntegerDivision) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 31; ++k) {
    const int64_t p = int64_t{1} << k;
    for (int64_t d : {p - 1, p, p + 1}) {
      if (d <= INT_MAX) divisors.push_back(static_cast<int>(d));
    }
  }
  std::uniform_int_distribution<int> any(1, INT_MAX);
  for (int i = 0; i < 2000; ++i) divisors.push_back(any(rng));
  for (int d : divisors) EXPECT_EQ(wrong_quotients(d, rng), 0u) << "divisor " << d;
}

TEST(FastDivide, EveryDividendOfSmallDivisors) {
  // Swin's and BERT's sizes: every n below 2^20 for the divisors the softmax takes most often.
  for (int d : {1, 3, 4, 6, 7, 12, 16, 24, 49, 64, 128, 144, 512}) {
    const FastDivide divide(d);
    size_t wrong = 0;
    for (int n = 0; n < (1 << 20); ++n) wrong += divide.quotient(n) != n / d;
    EXPECT_EQ(wrong, 0u) << "divisor " << d;
  }
}

TEST(FastDivide, RejectsDivisorsBelowOne) {
  EXPECT_THROW(FastDivide(0), std::invalid_argument);
  EXPECT_THROW(FastDivide(-3), std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::kernels
