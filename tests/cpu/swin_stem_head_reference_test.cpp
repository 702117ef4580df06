// The float64 references of the patch columns and the mean over tokens (kernels/patch_columns.h,
// kernels/token_mean.h): the columns times a convolution's flattened weight equal the stride-patch
// convolution computed directly; the mean's backward is its forward's adjoint.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/reference/patch_columns.h"
#include "kernels/reference/token_mean.h"

namespace fusekit::reference {
namespace {

std::vector<double> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

TEST(PatchColumnsReference, ColumnsTimesWeightIsTheConvolution) {
  const int B = 2, Cin = 3, H = 8, W = 12, P = 4, C = 5;
  const std::vector<double> images = random_values(static_cast<size_t>(B) * Cin * H * W, 1);
  const std::vector<double> weight = random_values(static_cast<size_t>(C) * Cin * P * P, 2);  // [C, Cin, P, P]
  const std::vector<double> columns = patch_columns_forward(images, B, Cin, H, W, P);
  const int K = Cin * P * P, GH = H / P, GW = W / P;
  ASSERT_EQ(columns.size(), static_cast<size_t>(B) * GH * GW * K);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < GH; ++i) {
      for (int j = 0; j < GW; ++j) {
        const size_t row = (static_cast<size_t>(b) * GH + i) * GW + j;
        for (int c = 0; c < C; ++c) {
          double gemm = 0, conv = 0;
          for (int k = 0; k < K; ++k) gemm += columns[row * K + k] * weight[static_cast<size_t>(c) * K + k];
          for (int ci = 0; ci < Cin; ++ci) {
            for (int y = 0; y < P; ++y) {
              for (int x = 0; x < P; ++x) {
                conv += images[((static_cast<size_t>(b) * Cin + ci) * H + i * P + y) * W + j * P + x] *
                        weight[((static_cast<size_t>(c) * Cin + ci) * P + y) * P + x];
              }
            }
          }
          EXPECT_NEAR(gemm, conv, 1e-12) << b << " " << i << " " << j << " " << c;
        }
      }
    }
  }
}

TEST(PatchColumnsReference, KnownPixel) {
  // 1 image, 2 channels, 4 x 4, patch 2: pixel (c 1, row 3, column 0) is patch (1, 0), column
  // (1, 1, 0) = 1 x 4 + 1 x 2 + 0 = 6 of row 1 x 2 + 0 = 2.
  std::vector<double> images(32, 0.0);
  images[(1 * 4 + 3) * 4 + 0] = 7.0;
  const std::vector<double> columns = patch_columns_forward(images, 1, 2, 4, 4, 2);
  EXPECT_EQ(columns[2 * 8 + 6], 7.0);
  double sum = 0;
  for (double v : columns) sum += v;
  EXPECT_EQ(sum, 7.0);  // a permutation: every pixel once
}

TEST(TokenMeanReference, MeanAndAdjoint) {
  const int B = 3, L = 7, F = 5;
  const std::vector<double> x = random_values(static_cast<size_t>(B) * L * F, 3);
  const std::vector<double> dy = random_values(static_cast<size_t>(B) * F, 4);
  const std::vector<double> y = token_mean_forward(x, B, L, F);
  double expect = 0;
  for (int l = 0; l < L; ++l) expect += x[(static_cast<size_t>(1) * L + l) * F + 2];
  EXPECT_NEAR(y[1 * F + 2], expect / L, 1e-15);
  // <y, dy> = <x, dx>: the backward is the forward's adjoint.
  const std::vector<double> dx = token_mean_backward(dy, B, L, F);
  double left = 0, right = 0;
  for (size_t i = 0; i < y.size(); ++i) left += y[i] * dy[i];
  for (size_t i = 0; i < x.size(); ++i) right += x[i] * dx[i];
  EXPECT_NEAR(left, right, 1e-12);
}

}  // namespace
}  // namespace fusekit::reference
