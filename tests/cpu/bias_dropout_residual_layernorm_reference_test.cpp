// The pieces of bias + dropout + residual + LayerNorm that need no GPU: the Philox generator against
// Random123's published known answers, the dropout stream's statistics, and the float64 reference's
// backward against central finite differences of its forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/detail/philox.cuh"
#include "kernels/reference/bias_dropout_residual_layernorm.h"

namespace fusekit {
namespace {

TEST(Philox, MatchesRandom123KnownAnswers) {
  // Random123's tests/kat_vectors, the "philox4x32 10" lines: counter, key, expected words.
  struct Answer {
    uint32_t counter[4];
    uint32_t key[2];
    uint32_t expected[4];
  };
  const Answer answers[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Answer& a : answers) {
    const kernels::PhiloxWords out =
        kernels::philox4x32_10({{a.counter[0], a.counter[1], a.counter[2], a.counter[3]}}, a.key[0], a.key[1]);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(out.w[k], a.expected[k]) << "word " << k;
  }
}

TEST(DropoutStream, ThresholdKeepsEverythingAtZeroAndRoundsElsewhere) {
  EXPECT_EQ(kernels::dropout_threshold(0.f), 0u);
  EXPECT_EQ(kernels::dropout_threshold(0.5f), 0x8000u);
  EXPECT_EQ(kernels::dropout_threshold(0.1f), 6554u);                         // round(6553.6)
  EXPECT_EQ(kernels::dropout_threshold(std::nextafter(1.f, 0.f)), 0x10000u);  // rounds to 2^16: drops all
  EXPECT_EQ(kernels::dropout_threshold(1.f), 0x10000u);
  const std::vector<double> m = reference::dropout_multipliers(7, 13, 0.f, 123, 4);
  for (double v : m) EXPECT_EQ(v, 1.0);  // p = 0: identity, exactly
}

TEST(DropoutStream, BitsAgreeWithSingleElementsAndStatisticsHold) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t seed = rng(), offset = rng() >> 8;
  const float p = 0.1f;
  const uint32_t threshold = kernels::dropout_threshold(p);
  const uint64_t n = 1 << 20;
  uint64_t kept = 0, same_as_next_offset = 0;
  for (uint64_t first = 0; first < n; first += 8) {
    const uint32_t bits = kernels::dropout_kept_bits<8>(seed, offset, first, threshold);
    const uint32_t next = kernels::dropout_kept_bits<8>(seed, offset + 1, first, threshold);
    // The halves of a group, as the 4-element vectors of float rows draw them.
    ASSERT_EQ(kernels::dropout_kept_bits<4>(seed, offset, first, threshold), bits & 0xFu) << "element " << first;
    ASSERT_EQ(kernels::dropout_kept_bits<4>(seed, offset, first + 4, threshold), bits >> 4) << "element " << first;
    for (int k = 0; k < 8; ++k) {
      const bool one = kernels::dropout_kept(seed, offset, first + k, threshold);
      ASSERT_EQ(((bits >> k) & 1u) != 0, one) << "element " << first + k;
      kept += one;
      same_as_next_offset += ((bits ^ next) >> k & 1u) == 0;
    }
  }
  // Binomial(n, 1 - p): 6 standard deviations.
  const double sigma = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 6 * sigma);
  // Another offset is another mask: two independent masks agree on p^2 + (1 - p)^2 of elements.
  const double agree = p * p + (1 - p) * (1 - p);
  EXPECT_NEAR(static_cast<double>(same_as_next_offset), n * agree, 6 * std::sqrt(n * agree * (1 - agree)));
}

// The scalar loss sum(dy * y) + sum(dh_extra * h), whose gradients the backward computes.
double loss(const std::vector<double>& x, const std::vector<double>& bias, const std::vector<double>& residual,
            const std::vector<double>& gamma, const std::vector<double>& beta, const std::vector<double>& m,
            const std::vector<double>& dy, const std::vector<double>& dh_extra, int rows, int columns, double eps) {
  const auto f =
      reference::bias_dropout_residual_layernorm_forward(x, bias, residual, gamma, beta, m, rows, columns, eps);
  double l = 0;
  for (size_t i = 0; i < f.y.size(); ++i) l += dy[i] * f.y[i] + (dh_extra.empty() ? 0.0 : dh_extra[i] * f.h[i]);
  return l;
}

TEST(BiasDropoutResidualLayerNormReference, BackwardMatchesFiniteDifferences) {
  const int rows = 3, columns = 11;
  const double eps = 1e-5;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t n = static_cast<size_t>(rows) * columns;
  std::vector<double> x(n), residual(n), dy(n), extra(n), bias(columns), gamma(columns), beta(columns);
  for (auto* v : {&x, &residual, &dy, &extra, &bias, &gamma, &beta}) {
    for (double& e : *v) e = normal(rng);
  }
  const std::vector<double> m = reference::dropout_multipliers(rows, columns, 0.5f, rng(), rng());
  for (bool pre_ln : {false, true}) {
    const std::vector<double> dh_extra = pre_ln ? extra : std::vector<double>{};
    const auto h =
        reference::bias_dropout_residual_layernorm_forward(x, bias, residual, gamma, beta, m, rows, columns, eps).h;
    const auto grad =
        reference::bias_dropout_residual_layernorm_backward(dy, dh_extra, h, gamma, m, rows, columns, eps);
    // Central differences of every input, against the analytic gradient.
    auto check = [&](std::vector<double>& input, const std::vector<double>& analytic, const char* name) {
      const double step = 1e-6;
      for (size_t i = 0; i < input.size(); ++i) {
        const double saved = input[i];
        input[i] = saved + step;
        const double up = loss(x, bias, residual, gamma, beta, m, dy, dh_extra, rows, columns, eps);
        input[i] = saved - step;
        const double down = loss(x, bias, residual, gamma, beta, m, dy, dh_extra, rows, columns, eps);
        input[i] = saved;
        EXPECT_NEAR(analytic[i], (up - down) / (2 * step), 1e-6 * (1 + std::abs(analytic[i])))
            << name << "[" << i << "], pre-LN " << pre_ln;
      }
    };
    check(x, grad.dx, "dx");
    check(residual, grad.dresidual, "dresidual");
    check(bias, grad.dbias, "dbias");
    check(gamma, grad.dgamma, "dgamma");
    check(beta, grad.dbeta, "dbeta");
  }
}

}  // namespace
}  // namespace fusekit
