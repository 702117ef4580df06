// Swin's patch columns and mean over tokens (kernels/patch_columns.h, kernels/token_mean.h) against
// their float64 references, on fresh random inputs with outputs poisoned (NaN) first; fp32, fp16,
// bf16; Swin-T's shapes (batch 2 of 224 x 224 x 3 at patch 4; 49 tokens of 768) and odd ones. The
// columns are a copy: equal to the reference bit for bit. The mean: DESIGN.md's bound.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/patch_columns.h"
#include "kernels/reference/patch_columns.h"
#include "kernels/reference/token_mean.h"
#include "kernels/token_mean.h"

namespace fusekit::kernels {
namespace {

std::vector<double> random_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

struct PatchCase {
  int batch, channels, height, width, patch;
};

class PatchColumnsTest : public ::testing::TestWithParam<std::tuple<DType, PatchCase>> {};

TEST_P(PatchColumnsTest, MatchesTheReferenceExactly) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, c] = GetParam();
  std::mt19937_64 rng(11);
  const PatchColumnsShape shape{c.batch, c.channels, c.height, c.width, c.patch};
  std::vector<double> images = random_values(static_cast<size_t>(c.batch) * c.channels * c.height * c.width, rng);
  Buffer in(images.size(), dtype), out(static_cast<size_t>(shape.rows()) * shape.columns(), dtype);
  in.upload(images);  // images now hold the stored (rounded) values
  patch_columns_forward(dtype, in.get(), out.get(), shape, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> expected =
      reference::patch_columns_forward(images, c.batch, c.channels, c.height, c.width, c.patch);
  const std::vector<double> got = out.download();
  size_t bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) bad += !(got[i] == expected[i]);
  EXPECT_EQ(bad, 0u) << "of " << expected.size();
}

INSTANTIATE_TEST_SUITE_P(Shapes, PatchColumnsTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(PatchCase{2, 3, 224, 224, 4}, PatchCase{1, 3, 12, 20, 4},
                                                              PatchCase{3, 5, 6, 9, 3}, PatchCase{1, 1, 1, 1, 1})));

TEST(PatchColumns, BadShapesThrow) {
  EXPECT_THROW(patch_columns_forward(DType::f16, reinterpret_cast<void*>(16), reinterpret_cast<void*>(16),
                                     {1, 3, 10, 12, 4}, nullptr),
               std::invalid_argument);
  EXPECT_THROW(patch_columns_forward(DType::f16, reinterpret_cast<void*>(16), reinterpret_cast<void*>(16),
                                     {0, 3, 8, 8, 4}, nullptr),
               std::invalid_argument);
}

struct MeanCase {
  int batch, tokens, features;
};

class TokenMeanTest : public ::testing::TestWithParam<std::tuple<DType, MeanCase>> {};

TEST_P(TokenMeanTest, ForwardAndBackwardMatchTheReference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, c] = GetParam();
  std::mt19937_64 rng(12);
  std::vector<double> x = random_values(static_cast<size_t>(c.batch) * c.tokens * c.features, rng);
  std::vector<double> dy = random_values(static_cast<size_t>(c.batch) * c.features, rng);
  Buffer x_d(x.size(), dtype), y_d(dy.size(), dtype), dy_d(dy.size(), dtype), dx_d(x.size(), dtype);
  x_d.upload(x);
  dy_d.upload(dy);
  token_mean_forward(dtype, x_d.get(), y_d.get(), c.batch, c.tokens, c.features, nullptr);
  token_mean_backward(dtype, dy_d.get(), dx_d.get(), c.batch, c.tokens, c.features, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(relative_error(y_d.download(), reference::token_mean_forward(x, c.batch, c.tokens, c.features)),
            tolerance(dtype));
  EXPECT_LE(relative_error(dx_d.download(), reference::token_mean_backward(dy, c.batch, c.tokens, c.features)),
            tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, TokenMeanTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(MeanCase{128, 49, 768}, MeanCase{3, 1, 5},
                                                              MeanCase{1, 144, 1}, MeanCase{7, 49, 1025})));

}  // namespace
}  // namespace fusekit::kernels
