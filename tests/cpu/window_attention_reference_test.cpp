// The float64 reference of Swin window attention, with no GPU: Swin's relative position index,
// the forward on inputs whose answer is known (uniform attention averages V; the log-sum-exp), and
// every gradient (dqkv and the bias table's) against central finite differences of the forward, with
// a shift mask over two windows per image and a table entry no pair uses (its gradient is 0).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/reference/window_attention.h"
#include "kernels/window_attention.h"
#include "tests/cpu/reference_test_support.h"

namespace fusekit {
namespace {

using test::dot;
using test::random_vector;

TEST(WindowAttentionReference, RelativePositionIndexIsSwins) {
  // Swin: coords (y, x) of each token, relative = a - b, shifted by window - 1, y times 2 window - 1.
  for (int window : {2, 7, 12}) {
    const std::vector<int32_t> index = kernels::relative_position_index(window);
    const int n = window * window;
    ASSERT_EQ(index.size(), static_cast<size_t>(n) * n);
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        const int ry = a / window - b / window + window - 1, rx = a % window - b % window + window - 1;
        ASSERT_EQ(index[static_cast<size_t>(a) * n + b], ry * (2 * window - 1) + rx);
      }
    }
  }
  const std::vector<int32_t> seven = kernels::relative_position_index(7);
  EXPECT_EQ(seven[0], 84);             // a token against itself: the table's centre
  EXPECT_EQ(seven[48], 0);             // top-left against bottom-right
  EXPECT_EQ(seven[48 * 49 + 0], 168);  // bottom-right against top-left: the last entry
}

TEST(WindowAttentionReference, UniformAttentionAveragesValues) {
  const reference::WindowAttentionSizes s{2, 2, 4, 3, 0};
  std::mt19937_64 rng(7);
  std::vector<double> qkv = random_vector(static_cast<size_t>(s.windows) * s.tokens * 3 * s.heads * s.head_dim, rng);
  for (size_t e = 0; e < qkv.size(); ++e) {
    const size_t part = e / (s.heads * s.head_dim) % 3;
    if (part == 1) qkv[e] = 0;  // K = 0: every score is the (constant) bias
  }
  const std::vector<double> table(9 * s.heads, 0.5);
  std::vector<int> index(16);
  for (int i = 0; i < 16; ++i) index[i] = i % 9;
  const auto o = reference::window_attention_forward(qkv, table, index, {}, s, 0.3);
  for (int b = 0; b < s.windows; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      for (int i = 0; i < s.tokens; ++i) {
        EXPECT_NEAR(o.lse[(b * s.heads + h) * s.tokens + i], 0.5 + std::log(4.0), 1e-12);
        for (int c = 0; c < s.head_dim; ++c) {
          double mean = 0;
          for (int j = 0; j < s.tokens; ++j) mean += qkv[(((b * s.tokens + j) * 3 + 2) * s.heads + h) * s.head_dim + c];
          EXPECT_NEAR(o.out[(b * s.tokens + i) * s.heads * s.head_dim + h * s.head_dim + c], mean / 4, 1e-12);
        }
      }
    }
  }
}

TEST(WindowAttentionReference, GradientsMatchFiniteDifferences) {
  // Window 2 (4 tokens, a 9-entry table), 4 windows of which 2 per image carry a shift mask.
  const reference::WindowAttentionSizes s{4, 2, 4, 3, 2};
  const double scale = 0.6;
  std::mt19937_64 rng(11);
  std::vector<double> qkv = random_vector(static_cast<size_t>(s.windows) * s.tokens * 3 * s.heads * s.head_dim, rng);
  std::vector<double> table = random_vector(10 * s.heads, rng);  // entry 9 is used by no pair
  std::vector<int> index;
  for (int32_t v : kernels::relative_position_index(2)) index.push_back(v);
  std::vector<double> mask(static_cast<size_t>(s.mask_windows) * s.tokens * s.tokens, 0.0);
  std::bernoulli_distribution far(0.3);
  for (double& v : mask) v = far(rng) ? -3.0 : 0.0;  // milder than Swin's -100, so differences see it
  const std::vector<double> g = random_vector(static_cast<size_t>(s.windows) * s.tokens * s.heads * s.head_dim, rng);
  auto loss = [&] { return dot(reference::window_attention_forward(qkv, table, index, mask, s, scale).out, g); };
  const auto grads = reference::window_attention_backward(qkv, table, index, mask, g, s, scale);

  auto check = [&](std::vector<double>& v, const std::vector<double>& analytic, const char* name) {
    ASSERT_EQ(v.size(), analytic.size()) << name;
    const double h = 1e-6;
    for (size_t i = 0; i < v.size(); ++i) {
      const double saved = v[i];
      v[i] = saved + h;
      const double up = loss();
      v[i] = saved - h;
      const double down = loss();
      v[i] = saved;
      EXPECT_NEAR(analytic[i], (up - down) / (2 * h), 1e-6 * (1 + std::abs(analytic[i]))) << name << "[" << i << "]";
    }
  };
  check(qkv, grads.dqkv, "dqkv");
  check(table, grads.dtable, "dtable");
  for (int h = 0; h < s.heads; ++h) EXPECT_EQ(grads.dtable[9 * s.heads + h], 0.0);
  // The mask matters: without it the output differs.
  const auto unmasked = reference::window_attention_forward(qkv, table, index, {}, {4, 2, 4, 3, 0}, scale);
  const auto masked = reference::window_attention_forward(qkv, table, index, mask, s, scale);
  double difference = 0;
  for (size_t i = 0; i < masked.out.size(); ++i) difference += std::abs(masked.out[i] - unmasked.out[i]);
  EXPECT_GT(difference, 1e-3);
}

}  // namespace
}  // namespace fusekit
