// The float64 reference of embedding + LayerNorm + dropout, without a GPU: its backward against
// central finite differences of its forward (repeated ids, unused table rows, dropout p = 0.5), and
// what a token with an id out of range does (NaN outputs, no gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/reference/bias_dropout_residual_layernorm.h"
#include "kernels/reference/embedding_layernorm.h"

namespace fusekit {
namespace {

constexpr int kHidden = 7;
constexpr double kEps = 1e-5;

struct Problem {
  reference::EmbeddingIds ids;
  reference::EmbeddingTables tables;
  std::vector<double> gamma, beta, dy, m;
};

// 6 tokens over a vocabulary of 5 (word 3 three times, word 4 never), 4 positions (3 never), 2 types.
Problem make_problem(std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Problem p;
  p.ids.word = {3, 0, 3, 1, 3, 2};
  p.ids.position = {0, 1, 2, 0, 1, 2};
  p.ids.type = {0, 0, 0, 1, 1, 1};
  p.tables.vocab = 5;
  p.tables.max_positions = 4;
  p.tables.token_types = 2;
  p.tables.word.resize(5 * kHidden);
  p.tables.position.resize(4 * kHidden);
  p.tables.type.resize(2 * kHidden);
  p.gamma.resize(kHidden);
  p.beta.resize(kHidden);
  p.dy.resize(6 * kHidden);
  for (auto* v : {&p.tables.word, &p.tables.position, &p.tables.type, &p.beta, &p.dy}) {
    for (double& e : *v) e = normal(rng);
  }
  for (double& g : p.gamma) g = 1.0 + 0.2 * normal(rng);
  p.m = reference::dropout_multipliers(6, kHidden, 0.5f, rng(), rng());
  return p;
}

// sum(dy * y) over the rows whose ids are in range: the loss whose gradients the backward computes.
double loss(const Problem& p) {
  const auto f = reference::embedding_layernorm_forward(p.ids, p.tables, p.gamma, p.beta, p.m, kHidden, kEps);
  double l = 0;
  for (size_t i = 0; i < f.y.size(); ++i) {
    if (!std::isnan(f.y[i])) l += p.dy[i] * f.y[i];
  }
  return l;
}

void expect_matches_finite_differences(Problem& p) {
  const auto grad = reference::embedding_layernorm_backward(p.dy, p.ids, p.tables, p.gamma, p.m, kHidden, kEps);
  auto check = [&](std::vector<double>& input, const std::vector<double>& analytic, const char* name) {
    ASSERT_EQ(input.size(), analytic.size()) << name;
    const double step = 1e-6;
    for (size_t i = 0; i < input.size(); ++i) {
      const double saved = input[i];
      input[i] = saved + step;
      const double up = loss(p);
      input[i] = saved - step;
      const double down = loss(p);
      input[i] = saved;
      EXPECT_NEAR(analytic[i], (up - down) / (2 * step), 1e-6 * (1 + std::abs(analytic[i]))) << name << "[" << i << "]";
    }
  };
  check(p.tables.word, grad.dword, "dword");
  check(p.tables.position, grad.dposition, "dposition");
  check(p.tables.type, grad.dtoken_type, "dtoken_type");
  check(p.gamma, grad.dgamma, "dgamma");
  check(p.beta, grad.dbeta, "dbeta");
  // Rows no token uses: exactly zero. Repeated rows: nonzero (three tokens' de summed).
  for (int c = 0; c < kHidden; ++c) {
    EXPECT_EQ(grad.dword[4 * kHidden + c], 0.0) << "unused word row, column " << c;
    EXPECT_EQ(grad.dposition[3 * kHidden + c], 0.0) << "unused position row, column " << c;
  }
}

TEST(EmbeddingLayerNormReference, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(std::random_device{}());
  Problem p = make_problem(rng);
  expect_matches_finite_differences(p);
}

TEST(EmbeddingLayerNormReference, IdsOutOfRangeGiveNaNRowsAndNoGradient) {
  std::mt19937_64 rng(std::random_device{}());
  Problem p = make_problem(rng);
  p.ids.word[1] = 5;       // one past the vocabulary
  p.ids.position[4] = -1;  // negative
  p.ids.type[5] = 2;       // one past the types
  const auto f = reference::embedding_layernorm_forward(p.ids, p.tables, p.gamma, p.beta, p.m, kHidden, kEps);
  for (int r : {1, 4, 5}) {
    EXPECT_TRUE(std::isnan(f.mean[r]) && std::isnan(f.rstd[r])) << "row " << r;
    for (int c = 0; c < kHidden; ++c) EXPECT_TRUE(std::isnan(f.y[r * kHidden + c])) << "row " << r;
  }
  for (int r : {0, 2, 3}) EXPECT_TRUE(std::isfinite(f.mean[r])) << "row " << r;
  const auto grad = reference::embedding_layernorm_backward(p.dy, p.ids, p.tables, p.gamma, p.m, kHidden, kEps);
  // Word 0 was used only by row 1, word 2 only by row 5: no gradient reaches them.
  for (int c = 0; c < kHidden; ++c) {
    EXPECT_EQ(grad.dword[0 * kHidden + c], 0.0);
    EXPECT_EQ(grad.dword[2 * kHidden + c], 0.0);
  }
  expect_matches_finite_differences(p);  // the remaining rows' gradients are still the loss's
}

}  // namespace
}  // namespace fusekit
