// LayerNorm forward and backward against the float64 reference, on fresh random inputs, with
// every output poisoned (NaN) before the run: fp32, fp16 and bf16; row lengths 1, 31, 128, 192, 768,
// 1000, 1536, 4096, 12288 and one past the register paths; a single row and a million rows (outputs
// larger than L2 take streaming stores). The inference forward (no mean and rstd) must give the
// training forward's y to the bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/common.cuh"
#include "kernels/layernorm.h"
#include "kernels/reference/layernorm.h"

namespace fusekit::kernels {
namespace {

struct Shape {
  int rows;
  int columns;
};

class LayerNormTest : public ::testing::TestWithParam<std::tuple<DType, Shape>> {};

TEST_P(LayerNormTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape] = GetParam();
  const int rows = shape.rows, C = shape.columns;
  const size_t n = static_cast<size_t>(rows) * C;
  const double eps = 1e-5;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(n), gamma(C), beta(C), dy(n);
  for (auto& v : x) v = 0.5 + 2.0 * normal(rng);  // an offset mean, as real activations have
  for (auto& v : gamma) v = 1.0 + 0.2 * normal(rng);
  for (auto& v : beta) v = 0.1 * normal(rng);
  for (auto& v : dy) v = normal(rng);

  Buffer dx_in(n, dtype), g(C, dtype), b(C, dtype), y(n, dtype), y_inference(n, dtype), grad_y(n, dtype), dx(n, dtype),
      dgamma(C, dtype), dbeta(C, dtype);
  dx_in.upload(x);
  g.upload(gamma);
  b.upload(beta);
  grad_y.upload(dy);
  float *mean = nullptr, *rstd = nullptr;
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&mean, std::max(rows, 1) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&rstd, std::max(rows, 1) * sizeof(float)));
  CHECK_CUDA(cudaMemset(mean, 0xFF, std::max(rows, 1) * sizeof(float)));
  CHECK_CUDA(cudaMemset(rstd, 0xFF, std::max(rows, 1) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&workspace, layernorm_backward_workspace_bytes(rows, C)));
  CHECK_CUDA(cudaMemset(workspace, 0xFF, layernorm_backward_workspace_bytes(rows, C)));

  layernorm_forward(dtype, dx_in.get(), g.get(), b.get(), y.get(), mean, rstd, rows, C, static_cast<float>(eps),
                    nullptr);
  layernorm_forward(dtype, dx_in.get(), g.get(), b.get(), y_inference.get(), nullptr, nullptr, rows, C,
                    static_cast<float>(eps), nullptr);
  layernorm_backward(dtype, grad_y.get(), dx_in.get(), g.get(), mean, rstd, dx.get(), dgamma.get(), dbeta.get(), rows,
                     C, workspace, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  const auto ref = reference::layernorm_forward(x, gamma, beta, rows, C, eps);
  const auto ref_grad = reference::layernorm_backward(dy, x, gamma, rows, C, eps);
  const double tol = tolerance(dtype);
  const std::vector<double> y_training = y.download();
  EXPECT_LT(relative_error(y_training, ref.y), tol) << "y";
  const std::vector<double> y_inferred = y_inference.download();
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += !(y_inferred[i] == y_training[i]);  // NaN (left poisoned) differs
  EXPECT_EQ(differ, 0u) << "elements where the inference forward's y differs from the training forward's";
  EXPECT_LT(mean_error(download_floats(mean, rows), ref.mean, ref.rstd), 1e-5) << "mean";
  EXPECT_LT(relative_error(download_floats(rstd, rows), ref.rstd), 1e-5) << "rstd";
  // C == 1: xhat is 0 and dx is exactly 0 in the reference; compare absolutely.
  EXPECT_LT(relative_error(dx.download(), ref_grad.dx), C == 1 ? 1e-6 : tol) << "dx";
  EXPECT_LT(relative_error(dgamma.download(), ref_grad.dgamma), C == 1 ? 1e-6 : tol) << "dgamma";
  EXPECT_LT(relative_error(dbeta.download(), ref_grad.dbeta), tol) << "dbeta";

  cudaFree(mean);
  cudaFree(rstd);
  cudaFree(workspace);
}

TEST(LayerNormArguments, MeanAndRstdAreBothGivenOrBothNull) {
  float statistic = 0.f;
  EXPECT_THROW(layernorm_forward(DType::f32, &statistic, &statistic, &statistic, &statistic, &statistic, nullptr, 1, 1,
                                 1e-5f, nullptr),
               std::invalid_argument);
  EXPECT_THROW(layernorm_forward(DType::f32, &statistic, &statistic, &statistic, &statistic, nullptr, &statistic, 1, 1,
                                 1e-5f, nullptr),
               std::invalid_argument);
}

std::string shape_name(const ::testing::TestParamInfo<std::tuple<DType, Shape>>& info) {
  const auto [dtype, shape] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(shape.rows) + "x" + std::to_string(shape.columns);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(Shape{257, 1}, Shape{300, 31}, Shape{1000, 768},
                                                              Shape{77, 1000}, Shape{64, 1536}, Shape{1, 4096},
                                                              Shape{33, 4096}, Shape{9, 12288}, Shape{3, 70000},
                                                              Shape{1'000'000, 32}, Shape{2, 33}, Shape{200'003, 128},
                                                              Shape{150'001, 192})),
                         shape_name);

}  // namespace
}  // namespace fusekit::kernels
