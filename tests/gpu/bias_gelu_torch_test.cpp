// bias + GELU's fused forward and backward against libtorch autograd of the baseline: the fused
// result may be at most twice as far from a float64 computation as PyTorch's own result in the
// same dtype, with a floor for fp32, where both are at rounding level.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "baselines/bias_gelu.h"
#include "gpu_test_support.h"
#include "kernels/bias_gelu.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  bool tanh_form;
  int rows;
  int columns;
};

class BiasGeluTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(BiasGeluTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string approximate = p.tanh_form ? "tanh" : "none";
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const at::Tensor x = at::randn({p.rows, p.columns}, options) * 2;
  const at::Tensor bias = at::randn({p.columns}, options) * 0.5;
  const at::Tensor dy = at::randn({p.rows, p.columns}, options);

  const auto ref =
      baselines::bias_gelu_forward_backward(x.to(at::kDouble), bias.to(at::kDouble), dy.to(at::kDouble), approximate);
  const auto eager = baselines::bias_gelu_forward_backward(x, bias, dy, approximate);

  at::Tensor y = at::full_like(x, NAN), dx = at::full_like(x, NAN), dbias = at::full_like(bias, NAN);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(kernels::bias_gelu_backward_workspace_bytes(p.rows, p.columns))},
                at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  const auto approximation = p.tanh_form ? kernels::GeluApproximation::tanh : kernels::GeluApproximation::none;
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::bias_gelu_forward(p.dtype, approximation, x.data_ptr(), bias.data_ptr(), y.data_ptr(), p.rows, p.columns,
                             stream);
  kernels::bias_gelu_backward(p.dtype, approximation, dy.data_ptr(), x.data_ptr(), bias.data_ptr(), dx.data_ptr(),
                              dbias.data_ptr(), p.rows, p.columns, workspace.data_ptr(), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  expect_within_twice_eager("y", y, eager.y, ref.y, floor);
  expect_within_twice_eager("dx", dx, eager.dx, ref.dx, floor);
  expect_within_twice_eager("dbias", dbias, eager.dbias, ref.dbias, floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(kernels::dtype_name(info.param.dtype)) + (info.param.tanh_form ? "_tanh_" : "_erf_") +
         std::to_string(info.param.rows) + "x" + std::to_string(info.param.columns);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BiasGeluTorchTest,
    ::testing::Values(Param{kernels::DType::f32, false, 300, 31}, Param{kernels::DType::f32, true, 2048, 3072},
                      Param{kernels::DType::f16, false, 8192, 3072}, Param{kernels::DType::f16, true, 1000, 1000},
                      Param{kernels::DType::bf16, false, 8192, 3072}, Param{kernels::DType::bf16, true, 77, 4099}),
    param_name);

}  // namespace
}  // namespace fusekit
