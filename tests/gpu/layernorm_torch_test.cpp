// LayerNorm's fused forward and backward against libtorch autograd of the baseline. The fused
// result may be at most twice as far from a float64 computation as PyTorch's own result in the
// same dtype (the FlashAttention rule: a tolerance grounded in what the baseline achieves), with a
// floor for fp32, where both are at rounding level.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "baselines/layernorm.h"
#include "gpu_test_support.h"
#include "kernels/layernorm.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  int rows;
  int columns;
};

class LayerNormTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(LayerNormTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const double eps = 1e-5;
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const at::Tensor x = at::randn({p.rows, p.columns}, options) * 2 + 0.5;
  const at::Tensor gamma = at::randn({p.columns}, options) * 0.2 + 1;
  const at::Tensor beta = at::randn({p.columns}, options) * 0.1;
  const at::Tensor dy = at::randn({p.rows, p.columns}, options);

  const auto ref = baselines::layernorm_forward_backward(x.to(at::kDouble), gamma.to(at::kDouble), beta.to(at::kDouble),
                                                         dy.to(at::kDouble), eps);
  const auto eager = baselines::layernorm_forward_backward(x, gamma, beta, dy, eps);

  at::Tensor y = at::full_like(x, NAN), dx = at::full_like(x, NAN);
  at::Tensor dgamma = at::full_like(gamma, NAN), dbeta = at::full_like(beta, NAN);
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor mean = at::full({p.rows}, NAN, float_options), rstd = at::full({p.rows}, NAN, float_options);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(kernels::layernorm_backward_workspace_bytes(p.rows, p.columns))},
                at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::layernorm_forward(p.dtype, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), y.data_ptr(),
                             mean.data_ptr<float>(), rstd.data_ptr<float>(), p.rows, p.columns, static_cast<float>(eps),
                             stream);
  kernels::layernorm_backward(p.dtype, dy.data_ptr(), x.data_ptr(), gamma.data_ptr(), mean.data_ptr<float>(),
                              rstd.data_ptr<float>(), dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), p.rows,
                              p.columns, workspace.data_ptr(), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  expect_within_twice_eager("y", y, eager.y, ref.y, floor);
  expect_within_twice_eager("dx", dx, eager.dx, ref.dx, floor);
  expect_within_twice_eager("dgamma", dgamma, eager.dgamma, ref.dgamma, floor);
  expect_within_twice_eager("dbeta", dbeta, eager.dbeta, ref.dbeta, floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(kernels::dtype_name(info.param.dtype)) + "_" + std::to_string(info.param.rows) + "x" +
         std::to_string(info.param.columns);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTorchTest,
                         ::testing::Values(Param{kernels::DType::f32, 300, 31}, Param{kernels::DType::f32, 8192, 768},
                                           Param{kernels::DType::f16, 8192, 768},
                                           Param{kernels::DType::bf16, 8192, 768}, Param{kernels::DType::f16, 77, 1000},
                                           Param{kernels::DType::bf16, 33, 4096}, Param{kernels::DType::f16, 5, 12288},
                                           Param{kernels::DType::bf16, 3, 70000},
                                           Param{kernels::DType::f16, 4096, 1024}),
                         param_name);

}  // namespace
}  // namespace fusekit
