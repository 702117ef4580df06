// The float64 references of Swin's window operations, without a GPU: the partition against a naive
// roll + view/permute written independently (Swin's window_partition index by index), partition
// then merge as the identity plus the residual, the patch gather against four strided slices
// concatenated, and every gradient against central finite differences (the merge's by its adjoint).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "kernels/reference/swin_window.h"
#include "tests/cpu/reference_test_support.h"

namespace fusekit {
namespace {

using test::dot;
using test::random_vector;

constexpr double kEps = 1e-5;

size_t elements(const reference::SwinWindowShape& s) {
  return static_cast<size_t>(s.batch) * s.height * s.width * s.channels;
}

// x.roll((-shift, -shift), (1, 2)).view(B, H/ws, ws, W/ws, ws, C).permute(0, 1, 3, 2, 4, 5): walk
// the permuted dimensions in order, each output element the next one.
std::vector<double> naive_roll_partition(const std::vector<double>& x, const reference::SwinWindowShape& s) {
  std::vector<double> out;
  const int ws = s.window;
  for (int b = 0; b < s.batch; ++b)
    for (int wh = 0; wh < s.height / ws; ++wh)
      for (int ww = 0; ww < s.width / ws; ++ww)
        for (int i = 0; i < ws; ++i)
          for (int j = 0; j < ws; ++j)
            for (int c = 0; c < s.channels; ++c) {
              const int h = (wh * ws + i + s.shift) % s.height, w = (ww * ws + j + s.shift) % s.width;
              out.push_back(x[((static_cast<size_t>(b) * s.height + h) * s.width + w) * s.channels + c]);
            }
  return out;
}

class WindowShapes : public ::testing::TestWithParam<reference::SwinWindowShape> {};

TEST_P(WindowShapes, PartitionMatchesNaiveRollAndPermute) {
  const auto s = GetParam();
  std::mt19937_64 rng(1);
  const std::vector<double> x = random_vector(elements(s), rng);
  EXPECT_EQ(reference::roll_partition(x, s), naive_roll_partition(x, s));
}

TEST_P(WindowShapes, PartitionThenMergeIsIdentityPlusResidual) {
  const auto s = GetParam();
  std::mt19937_64 rng(2);
  const std::vector<double> x = random_vector(elements(s), rng), shortcut = random_vector(elements(s), rng);
  const std::vector<double> y = reference::window_merge_forward(reference::roll_partition(x, s), shortcut, s);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] + shortcut[i]) << "element " << i;
  // And the partition is not the identity itself (with a shift or more than one window).
  if (s.shift != 0 || s.height != s.window || s.width != s.window) {
    EXPECT_NE(reference::roll_partition(x, s), x);
  }
}

TEST_P(WindowShapes, PartitionLayerNormsEachWindowToken) {
  const auto s = GetParam();
  std::mt19937_64 rng(3);
  const std::vector<double> x = random_vector(elements(s), rng, 2.0, 0.5);
  const std::vector<double> gamma = random_vector(s.channels, rng, 0.2, 1.0), beta = random_vector(s.channels, rng);
  const auto f = reference::window_partition_forward(x, gamma, beta, s, kEps);
  const std::vector<double> rows = naive_roll_partition(x, s);
  for (size_t r = 0; r < f.mean.size(); ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < s.channels; ++c) mean += rows[r * s.channels + c] / s.channels;
    for (int c = 0; c < s.channels; ++c) var += std::pow(rows[r * s.channels + c] - mean, 2) / s.channels;
    ASSERT_NEAR(f.mean[r], mean, 1e-12);
    ASSERT_NEAR(f.rstd[r], 1 / std::sqrt(var + kEps), 1e-9 * f.rstd[r]);
    for (int c = 0; c < s.channels; ++c) {
      const double expected = (rows[r * s.channels + c] - mean) / std::sqrt(var + kEps) * gamma[c] + beta[c];
      ASSERT_NEAR(f.windows[r * s.channels + c], expected, 1e-12);
    }
  }
}

// loss = sum(dy * f(inputs)); the backward's gradients against central differences of the loss.
template <class Loss>
void expect_gradient(const char* name, std::vector<double>& input, const std::vector<double>& gradient, Loss loss) {
  const double h = 1e-6;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    const double saved = input[i];
    input[i] = saved + h;
    const double up = loss();
    input[i] = saved - h;
    const double down = loss();
    input[i] = saved;
    const double numeric = (up - down) / (2 * h);
    diff += (numeric - gradient[i]) * (numeric - gradient[i]);
    norm += numeric * numeric;
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-6) << name;
}

TEST_P(WindowShapes, PartitionGradientsMatchFiniteDifferences) {
  const auto s = GetParam();
  std::mt19937_64 rng(4);
  std::vector<double> x = random_vector(elements(s), rng, 2.0, 0.5);
  std::vector<double> gamma = random_vector(s.channels, rng, 0.2, 1.0), beta = random_vector(s.channels, rng);
  const std::vector<double> dy = random_vector(elements(s), rng);
  const auto g = reference::window_partition_backward(dy, x, gamma, s, kEps);
  auto loss = [&] { return dot(dy, reference::window_partition_forward(x, gamma, beta, s, kEps).windows); };
  expect_gradient("dx", x, g.dx, loss);
  expect_gradient("dgamma", gamma, g.dgamma, loss);
  expect_gradient("dbeta", beta, g.dbeta, loss);
}

TEST_P(WindowShapes, MergeBackwardIsTheAdjoint) {
  const auto s = GetParam();
  std::mt19937_64 rng(5);
  const std::vector<double> windows = random_vector(elements(s), rng), dy = random_vector(elements(s), rng);
  const std::vector<double> zero(elements(s), 0.0), shortcut = random_vector(elements(s), rng);
  const auto g = reference::window_merge_backward(dy, s);
  // <dy, merge(windows, 0)> = <dwindows, windows>, and merge is linear in shortcut with identity.
  EXPECT_NEAR(dot(dy, reference::window_merge_forward(windows, zero, s)), dot(g.dwindows, windows), 1e-9);
  EXPECT_EQ(g.dshortcut, dy);
  const std::vector<double> y = reference::window_merge_forward(windows, shortcut, s);
  const std::vector<double> y0 = reference::window_merge_forward(windows, zero, s);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i] - y0[i], shortcut[i], 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowShapes,
                         ::testing::Values(reference::SwinWindowShape{2, 6, 6, 3, 3, 1},  // shifted, 2x2 windows
                                           reference::SwinWindowShape{2, 6, 6, 3, 3, 0},
                                           reference::SwinWindowShape{1, 4, 6, 5, 2, 1},  // H != W
                                           reference::SwinWindowShape{3, 3, 3, 4, 3, 1},  // one window, shifted
                                           reference::SwinWindowShape{1, 7, 7, 2, 7, 3}));

size_t elements(const reference::PatchMergingShape& s) {
  return static_cast<size_t>(s.batch) * s.height * s.width * s.channels;
}

TEST(PatchMergingReference, GatherIsFourStridedSlicesConcatenated) {
  const reference::PatchMergingShape s{2, 4, 6, 3};
  std::mt19937_64 rng(6);
  const std::vector<double> x = random_vector(elements(s), rng);
  const int half_h = s.height / 2, half_w = s.width / 2, C = s.channels;
  // x[:, h0::2, w0::2] for (h0, w0) = (0, 0), (1, 0), (0, 1), (1, 1): four [B, H/2, W/2, C] tensors.
  std::vector<std::vector<double>> slices;
  for (auto [h0, w0] : {std::pair{0, 0}, std::pair{1, 0}, std::pair{0, 1}, std::pair{1, 1}}) {
    std::vector<double> slice;
    for (int b = 0; b < s.batch; ++b)
      for (int h = h0; h < s.height; h += 2)
        for (int w = w0; w < s.width; w += 2)
          for (int c = 0; c < C; ++c)
            slice.push_back(x[((static_cast<size_t>(b) * s.height + h) * s.width + w) * C + c]);
    slices.push_back(slice);
  }
  std::vector<double> expected;  // torch.cat(slices, -1)
  for (size_t t = 0; t < static_cast<size_t>(s.batch) * half_h * half_w; ++t)
    for (const auto& slice : slices)
      for (int c = 0; c < C; ++c) expected.push_back(slice[t * C + c]);
  EXPECT_EQ(reference::patch_gather(x, s), expected);
}

TEST(PatchMergingReference, GradientsMatchFiniteDifferences) {
  const reference::PatchMergingShape s{2, 4, 2, 3};
  std::mt19937_64 rng(7);
  std::vector<double> x = random_vector(elements(s), rng, 2.0, 0.5);
  std::vector<double> gamma = random_vector(4 * s.channels, rng, 0.2, 1.0);
  std::vector<double> beta = random_vector(4 * s.channels, rng);
  const std::vector<double> dy = random_vector(elements(s), rng);
  const auto g = reference::patch_merging_backward(dy, x, gamma, s, kEps);
  auto loss = [&] { return dot(dy, reference::patch_merging_forward(x, gamma, beta, s, kEps).y); };
  expect_gradient("dx", x, g.dx, loss);
  expect_gradient("dgamma", gamma, g.dgamma, loss);
  expect_gradient("dbeta", beta, g.dbeta, loss);
}

}  // namespace
}  // namespace fusekit
