// The row gather's float64 reference, with no GPU: known rows, the backward as the forward's adjoint
// (<gather(x), y> = <x, scatter(y)> for every x and y, which is what makes it the gradient), rows no
// index names zero, and out-of-range indices (a NaN row forward, nothing backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/reference/gather_rows.h"
#include "tests/cpu/reference_test_support.h"

namespace fusekit {
namespace {

using test::dot;
using test::random_vector;

TEST(GatherRowsReference, ForwardCopiesTheNamedRows) {
  const std::vector<double> src = {0, 1, 10, 11, 20, 21, 30, 31};  // 4 rows of 2
  EXPECT_EQ(reference::gather_rows_forward(src, {2, 0, 3}, 4, 2), (std::vector<double>{20, 21, 0, 1, 30, 31}));
  EXPECT_TRUE(reference::gather_rows_forward(src, {}, 4, 2).empty());
}

TEST(GatherRowsReference, BackwardIsTheAdjointOfTheForward) {
  std::mt19937_64 rng(std::random_device{}());
  const int rows_in = 37, columns = 5;
  std::vector<int32_t> all(rows_in);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  for (const int rows_out : {0, 1, 11, rows_in}) {
    const std::vector<int32_t> indices(all.begin(), all.begin() + rows_out);
    const std::vector<double> x = random_vector(size_t(rows_in) * columns, rng);
    const std::vector<double> y = random_vector(size_t(rows_out) * columns, rng);
    const std::vector<double> gathered = reference::gather_rows_forward(x, indices, rows_in, columns);
    const std::vector<double> scattered = reference::gather_rows_backward(y, indices, rows_in, columns);
    ASSERT_EQ(scattered.size(), x.size());
    EXPECT_NEAR(dot(gathered, y), dot(x, scattered), 1e-12 * (1 + std::abs(dot(gathered, y)))) << rows_out;
    // Rows no index names are zero.
    std::vector<bool> named(rows_in, false);
    for (int32_t r : indices) named[r] = true;
    for (int r = 0; r < rows_in; ++r) {
      if (named[r]) continue;
      for (int c = 0; c < columns; ++c) EXPECT_EQ(scattered[size_t(r) * columns + c], 0.0) << r;
    }
  }
}

TEST(GatherRowsReference, OutOfRangeIndicesGiveNaNRowsAndNoGradient) {
  const std::vector<double> src = {0, 1, 10, 11};  // 2 rows of 2
  const std::vector<int32_t> indices = {-1, 1, 2};
  const std::vector<double> dst = reference::gather_rows_forward(src, indices, 2, 2);
  EXPECT_TRUE(std::isnan(dst[0]) && std::isnan(dst[1]));
  EXPECT_EQ(dst[2], 10);
  EXPECT_EQ(dst[3], 11);
  EXPECT_TRUE(std::isnan(dst[4]) && std::isnan(dst[5]));
  EXPECT_EQ(reference::gather_rows_backward({1, 2, 3, 4, 5, 6}, indices, 2, 2), (std::vector<double>{0, 0, 3, 4}));
  // Equal indices: the gradient sums their rows (the kernel requires distinct indices instead).
  EXPECT_EQ(reference::gather_rows_backward({1, 2, 3, 4}, {1, 1}, 2, 2), (std::vector<double>{0, 0, 4, 6}));
}

}  // namespace
}  // namespace fusekit
