// Error feedback's float64 reference: two steps worked by hand in each form, and over many random
// steps the invariants the GPU test leans on: sent + residual equals the sum of the gradients
// (residual accumulation), and the sum of the velocities (momentum correction).
#include "dp/error_feedback_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace fusekit::dp {
namespace {

TEST(ErrorFeedbackReference, ResidualAccumulationByHand) {
  ErrorFeedbackState state(3);
  EXPECT_EQ(error_feedback_step_reference(state, {1, -2, 3}, 0, {1}), (std::vector<double>{-2}));
  EXPECT_EQ(state.residual, (std::vector<double>{1, 0, 3}));
  EXPECT_EQ(error_feedback_step_reference(state, {1, 1, 1}, 0, {0, 2}), (std::vector<double>{2, 4}));
  EXPECT_EQ(state.residual, (std::vector<double>{0, 1, 0}));
  EXPECT_EQ(state.momentum, (std::vector<double>{0, 0, 0}));
}

// With the wire values given, a sent entry keeps what the wire rounded away.
TEST(ErrorFeedbackReference, WireRemainderStaysInTheResidual) {
  ErrorFeedbackState state(3);
  EXPECT_EQ(error_feedback_step_reference(state, {1, -2.25, 3}, 0.5, {1}, {-2.0}), (std::vector<double>{-2.25}));
  EXPECT_EQ(state.residual, (std::vector<double>{1, -0.25, 3}));
  EXPECT_EQ(state.momentum, (std::vector<double>{1, 0, 3}));
}

TEST(ErrorFeedbackReference, MomentumCorrectionByHand) {
  ErrorFeedbackState state(3);
  // u = g = v; -2 sent; u and v cleared at 1.
  EXPECT_EQ(error_feedback_step_reference(state, {1, -2, 3}, 0.5, {1}), (std::vector<double>{-2}));
  EXPECT_EQ(state.momentum, (std::vector<double>{1, 0, 3}));
  EXPECT_EQ(state.residual, (std::vector<double>{1, 0, 3}));
  // u = 0.5 u + g = (1.5, 1, 2.5); v += u = (2.5, 1, 5.5); 5.5 sent; u and v cleared at 2.
  EXPECT_EQ(error_feedback_step_reference(state, {1, 1, 1}, 0.5, {2}), (std::vector<double>{5.5}));
  EXPECT_EQ(state.momentum, (std::vector<double>{1.5, 1, 0}));
  EXPECT_EQ(state.residual, (std::vector<double>{2.5, 1, 0}));
}

TEST(ErrorFeedbackReference, NothingIsLostOverManySteps) {
  const size_t n = 1000;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0, 1);
  for (double momentum : {0.0, 0.9}) {
    ErrorFeedbackState state(n);
    std::vector<double> sent_sum(n, 0), added_sum(n, 0);  // sum of g, or of u before its clearing
    for (int step = 0; step < 50; ++step) {
      std::vector<double> g(n);
      for (double& x : g) x = normal(rng);
      std::vector<uint32_t> selected;
      for (uint32_t i = 0; i < n; ++i)
        if (rng() % 10 == 0) selected.push_back(i);
      for (size_t i = 0; i < n; ++i) added_sum[i] += momentum > 0 ? momentum * state.momentum[i] + g[i] : g[i];
      const std::vector<double> sent = error_feedback_step_reference(state, g, momentum, selected);
      ASSERT_EQ(sent.size(), selected.size());
      for (size_t j = 0; j < selected.size(); ++j) sent_sum[selected[j]] += sent[j];
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(sent_sum[i] + state.residual[i], added_sum[i], 1e-9) << "momentum " << momentum << ", " << i;
    }
  }
}

TEST(ErrorFeedbackReference, BadInputsThrow) {
  ErrorFeedbackState state(3);
  EXPECT_THROW(error_feedback_step_reference(state, {1, 2}, 0, {}), std::invalid_argument);
  EXPECT_THROW(error_feedback_step_reference(state, {1, 2, 3}, 0, {0, 1}, {1.0}), std::invalid_argument);
  EXPECT_THROW(error_feedback_step_reference(state, {1, 2, 3}, 0, {3}), std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::dp
