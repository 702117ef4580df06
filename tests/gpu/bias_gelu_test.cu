// bias + GELU forward and backward against the float64 reference, on fresh random inputs, with
// every output poisoned (NaN) before the run: fp32, fp16 and bf16, both GELU forms; row lengths
// 1, 31, 1000, 1536, 3072, 4096, 12288 and odd ones; a single row and a million rows.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/bias_gelu.h"
#include "kernels/reference/bias_gelu.h"

namespace fusekit::kernels {
namespace {

struct Shape {
  int rows;
  int columns;
};

using Param = std::tuple<DType, GeluApproximation, Shape>;

class BiasGeluTest : public ::testing::TestWithParam<Param> {};

TEST_P(BiasGeluTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, approximation, shape] = GetParam();
  const int rows = shape.rows, C = shape.columns;
  const size_t n = static_cast<size_t>(rows) * C;
  const bool tanh_form = approximation == GeluApproximation::tanh;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(n), bias(C), dy(n);
  for (auto& v : x) v = 2.0 * normal(rng);  // both tails of GELU, and the bend around 0
  for (auto& v : bias) v = 0.5 * normal(rng);
  for (auto& v : dy) v = normal(rng);

  Buffer x_d(n, dtype), bias_d(C, dtype), y_d(n, dtype), dy_d(n, dtype), dx_d(n, dtype), dbias_d(C, dtype);
  x_d.upload(x);
  bias_d.upload(bias);
  dy_d.upload(dy);
  void* workspace = nullptr;
  const size_t workspace_bytes = bias_gelu_backward_workspace_bytes(rows, C);
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_CUDA(cudaMemset(workspace, 0xFF, workspace_bytes));

  bias_gelu_forward(dtype, approximation, x_d.get(), bias_d.get(), y_d.get(), rows, C, nullptr);
  bias_gelu_backward(dtype, approximation, dy_d.get(), x_d.get(), bias_d.get(), dx_d.get(), dbias_d.get(), rows, C,
                     workspace, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  const auto y_ref = reference::bias_gelu_forward(x, bias, rows, C, tanh_form);
  const auto grad_ref = reference::bias_gelu_backward(dy, x, bias, rows, C, tanh_form);
  const double tol = tolerance(dtype);
  EXPECT_LT(relative_error(y_d.download(), y_ref), tol) << "y";
  EXPECT_LT(relative_error(dx_d.download(), grad_ref.dx), tol) << "dx";
  EXPECT_LT(relative_error(dbias_d.download(), grad_ref.dbias), tol) << "dbias";
  cudaFree(workspace);
}

TEST(BiasGelu, RejectsBadSizes) {
  EXPECT_THROW(bias_gelu_forward(DType::f16, GeluApproximation::none, nullptr, nullptr, nullptr, 4, 0, nullptr),
               std::invalid_argument);
  EXPECT_THROW(bias_gelu_backward_workspace_bytes(-1, 8), std::invalid_argument);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, approximation, shape] = info.param;
  return std::string(dtype_name(dtype)) + (approximation == GeluApproximation::tanh ? "_tanh_" : "_erf_") +
         std::to_string(shape.rows) + "x" + std::to_string(shape.columns);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasGeluTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(GeluApproximation::none, GeluApproximation::tanh),
                                            ::testing::Values(Shape{257, 1}, Shape{300, 31}, Shape{77, 1000},
                                                              Shape{64, 1536}, Shape{1, 3072}, Shape{500, 3072},
                                                              Shape{33, 4096}, Shape{9, 12288}, Shape{1'000'000, 8},
                                                              Shape{5, 4099}, Shape{3, 70000})),
                         param_name);

}  // namespace
}  // namespace fusekit::kernels
