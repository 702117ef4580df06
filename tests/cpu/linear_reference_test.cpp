// The float64 reference of the linear layer, with no GPU: the tanh-form GELU and its derivative
// against central finite differences, and every gradient of the reference (dx, dW, db; dpre and db
// through the GELU of an FFN's first layer) against central finite differences of its forward; the
// weight gradient alone, accumulated and not.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/reference/linear.h"
#include "tests/cpu/reference_test_support.h"

namespace fusekit {
namespace {

using test::dot;
using test::random_vector;

// Central difference of `loss` with respect to every element of `v` (which it reads by reference).
std::vector<double> finite_differences(std::vector<double>& v, const std::function<double()>& loss) {
  const double h = 1e-6;
  std::vector<double> grad(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + h;
    const double up = loss();
    v[i] = saved - h;
    const double down = loss();
    v[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const char* name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << name << "[" << i << "]";
}

TEST(LinearReference, GeluTanhIsTheTanhFormAndItsDerivativeMatchesFiniteDifferences) {
  EXPECT_EQ(reference::gelu_tanh(0.0), 0.0);
  EXPECT_NEAR(reference::gelu_tanh(10.0), 10.0, 1e-12);
  EXPECT_NEAR(reference::gelu_tanh(-10.0), 0.0, 1e-12);
  // The tanh form differs from the erf form by up to a few 1e-4 (at z = 1: 0.8411920 against 0.8413447).
  const double erf_form_at_1 = 0.5 * (1 + std::erf(1 / std::sqrt(2.0)));
  EXPECT_NEAR(reference::gelu_tanh(1.0), erf_form_at_1, 5e-4);
  EXPECT_GT(std::abs(reference::gelu_tanh(1.0) - erf_form_at_1), 1e-5);
  for (double z = -6; z <= 6; z += 0.01) {
    const double h = 1e-6;
    const double numeric = (reference::gelu_tanh(z + h) - reference::gelu_tanh(z - h)) / (2 * h);
    EXPECT_NEAR(reference::gelu_tanh_grad(z), numeric, 1e-8) << "z = " << z;
  }
}

TEST(LinearReference, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(std::random_device{}());
  const int rows = 3, n = 5, k = 4;
  std::vector<double> x = random_vector(rows * k, rng), w = random_vector(n * k, rng), b = random_vector(n, rng);
  const std::vector<double> dy = random_vector(rows * n, rng);
  auto loss = [&] { return dot(dy, reference::linear_forward(x, w, b, rows, n, k, false).y); };
  const reference::LinearBackward grad = reference::linear_backward(dy, x, w, rows, n, k);
  expect_close(grad.dx, finite_differences(x, loss), "dx");
  expect_close(grad.dweight, finite_differences(w, loss), "dweight");
  expect_close(grad.dbias, finite_differences(b, loss), "dbias");
}

// The weight gradient alone: linear_backward's dW and db, plus what dweight held where accumulating.
TEST(LinearReference, WeightGradientIsTheBackwardsPlusWhatWasThere) {
  std::mt19937_64 rng(std::random_device{}());
  const int rows = 5, n = 7, k = 3;
  const std::vector<double> x = random_vector(rows * k, rng), w = random_vector(n * k, rng),
                            dy = random_vector(rows * n, rng), before = random_vector(n * k, rng);
  const reference::LinearBackward full = reference::linear_backward(dy, x, w, rows, n, k);
  const reference::LinearBackward fresh = reference::linear_weight_gradient(dy, x, {}, rows, n, k);
  expect_close(fresh.dweight, full.dweight, "dweight");
  expect_close(fresh.dbias, full.dbias, "dbias");
  EXPECT_TRUE(fresh.dx.empty());
  const reference::LinearBackward added = reference::linear_weight_gradient(dy, x, before, rows, n, k);
  std::vector<double> sum(before);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += full.dweight[i];
  expect_close(added.dweight, sum, "dweight accumulated");
  expect_close(added.dbias, full.dbias, "dbias (never accumulated)");
}

TEST(LinearReference, GeluBackwardInputMatchesFiniteDifferencesThroughTheNextLayer) {
  std::mt19937_64 rng(std::random_device{}());
  const int rows = 4, n = 6, k = 3, n_next = 5;  // x [4, 3] -> pre, h [4, 6] -> z [4, 5]
  std::vector<double> x = random_vector(rows * k, rng), w = random_vector(n * k, rng), b = random_vector(n, rng);
  const std::vector<double> w_next = random_vector(n_next * n, rng), dz = random_vector(rows * n_next, rng);
  const std::vector<double> zero_bias(n_next, 0.0);
  auto loss_from_pre = [&](const std::vector<double>& pre) {
    std::vector<double> h(pre);
    for (double& v : h) v = reference::gelu_tanh(v);
    return dot(dz, reference::linear_forward(h, w_next, zero_bias, rows, n_next, n, false).y);
  };
  std::vector<double> pre = reference::linear_forward(x, w, b, rows, n, k, false).pre;
  const reference::GeluBackwardInput grad = reference::linear_gelu_backward_input(dz, w_next, pre, rows, n_next, n);
  expect_close(grad.dpre, finite_differences(pre, [&] { return loss_from_pre(pre); }), "dpre");
  auto loss_from_bias = [&] { return loss_from_pre(reference::linear_forward(x, w, b, rows, n, k, false).pre); };
  expect_close(grad.dbias, finite_differences(b, loss_from_bias), "dbias");
  // The forward's y is gelu(pre) in the gelu form.
  const reference::LinearForward f = reference::linear_forward(x, w, b, rows, n, k, true);
  for (size_t i = 0; i < f.y.size(); ++i) EXPECT_DOUBLE_EQ(f.y[i], reference::gelu_tanh(f.pre[i]));
}

}  // namespace
}  // namespace fusekit
