// Bias + dropout + residual + LayerNorm's fused forward and backward against libtorch autograd of the
// baseline. PyTorch's dropout RNG cannot draw fusekit's mask, so for p > 0 the baseline runs with the
// fused kernels' own mask (bias_dropout_residual_layernorm_mask): (x + bias) * mask / (1 - p); at
// p = 0 it is the plain eager composition. The fused result may be at most twice as far from a
// float64 computation as PyTorch's own result in the same dtype (the FlashAttention rule), with a
// floor for fp32, where both are at rounding level. The mask's statistics are checked too: the kept
// fraction, and that a new offset draws a new mask while the same offset redraws the same one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>
#include <string>

#include "baselines/bias_dropout_residual_layernorm.h"
#include "gpu_test_support.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  int rows;
  int columns;
  float p;
  kernels::ResidualOrder order;
};

at::Tensor fused_mask(kernels::DType dtype, kernels::Dropout dropout, int rows, int columns) {
  at::Tensor mask = at::full({rows, columns}, NAN, at::TensorOptions().dtype(torch_type(dtype)).device(at::kCUDA));
  kernels::bias_dropout_residual_layernorm_mask(dtype, dropout, mask.data_ptr(), rows, columns, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return mask;
}

class BiasDropoutResidualLayerNormTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(BiasDropoutResidualLayerNormTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const bool pre_ln = p.order == kernels::ResidualOrder::pre_ln;
  const double eps = 1e-5;
  std::mt19937_64 rng(std::random_device{}());
  const kernels::Dropout dropout{p.p, rng(), rng() >> 16};
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const at::Tensor x = at::randn({p.rows, p.columns}, options);
  const at::Tensor bias = at::randn({p.columns}, options) * 0.5;
  const at::Tensor residual = at::randn({p.rows, p.columns}, options) * 2 + 0.5;
  const at::Tensor gamma = at::randn({p.columns}, options) * 0.2 + 1;
  const at::Tensor beta = at::randn({p.columns}, options) * 0.1;
  const at::Tensor dy = at::randn({p.rows, p.columns}, options);
  const at::Tensor dh_extra = pre_ln ? at::randn({p.rows, p.columns}, options) : at::Tensor();

  // p = 0: the eager composition as it stands (its dropout is the identity); p > 0: the fused mask.
  const at::Tensor mask = p.p > 0 ? fused_mask(p.dtype, dropout, p.rows, p.columns) : at::Tensor();
  auto to_double = [](const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; };
  const auto ref = baselines::bias_dropout_residual_layernorm_forward_backward(
      to_double(x), to_double(bias), to_double(residual), to_double(gamma), to_double(beta), to_double(dy),
      to_double(dh_extra), p.p, eps, to_double(mask));
  const auto eager = baselines::bias_dropout_residual_layernorm_forward_backward(x, bias, residual, gamma, beta, dy,
                                                                                 dh_extra, p.p, eps, mask);

  at::Tensor h = at::full_like(x, NAN), y = at::full_like(x, NAN), dx = at::full_like(x, NAN),
             dresidual = at::full_like(x, NAN);
  at::Tensor dbias = at::full_like(bias, NAN), dgamma = at::full_like(gamma, NAN), dbeta = at::full_like(beta, NAN);
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor mean = at::full({p.rows}, NAN, float_options), rstd = at::full({p.rows}, NAN, float_options);
  at::Tensor workspace = at::empty(
      {static_cast<int64_t>(kernels::bias_dropout_residual_layernorm_backward_workspace_bytes(p.rows, p.columns))},
      at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::BiasDropoutResidualForwardTensors forward;
  forward.x = x.data_ptr();
  forward.bias = bias.data_ptr();
  forward.residual = residual.data_ptr();
  forward.gamma = gamma.data_ptr();
  forward.beta = beta.data_ptr();
  forward.h = pre_ln ? h.data_ptr() : nullptr;
  forward.y = y.data_ptr();
  forward.mean = mean.data_ptr<float>();
  forward.rstd = rstd.data_ptr<float>();
  kernels::bias_dropout_residual_layernorm_forward(p.dtype, p.order, forward, dropout, p.rows, p.columns,
                                                   static_cast<float>(eps), stream);
  kernels::BiasDropoutResidualBackwardTensors backward;
  backward.dy = dy.data_ptr();
  if (pre_ln) {
    backward.dh_extra = dh_extra.data_ptr();
    backward.h = h.data_ptr();
  } else {
    backward.x = x.data_ptr();
    backward.bias = bias.data_ptr();
    backward.residual = residual.data_ptr();
  }
  backward.gamma = gamma.data_ptr();
  backward.mean = mean.data_ptr<float>();
  backward.rstd = rstd.data_ptr<float>();
  backward.dx = dx.data_ptr();
  backward.dresidual = dresidual.data_ptr();
  backward.dbias = dbias.data_ptr();
  backward.dgamma = dgamma.data_ptr();
  backward.dbeta = dbeta.data_ptr();
  kernels::bias_dropout_residual_layernorm_backward(p.dtype, p.order, backward, dropout, p.rows, p.columns,
                                                    workspace.data_ptr(), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  expect_within_twice_eager("y", y, eager.y, ref.y, floor);
  expect_within_twice_eager("dx", dx, eager.dx, ref.dx, floor);
  expect_within_twice_eager("dresidual", dresidual, eager.dresidual, ref.dresidual, floor);
  expect_within_twice_eager("dbias", dbias, eager.dbias, ref.dbias, floor);
  expect_within_twice_eager("dgamma", dgamma, eager.dgamma, ref.dgamma, floor);
  expect_within_twice_eager("dbeta", dbeta, eager.dbeta, ref.dbeta, floor);
  if (pre_ln) expect_within_twice_eager("h", h, eager.h, ref.h, floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + "_" + std::to_string(p.rows) + "x" + std::to_string(p.columns) +
         "_p" + std::to_string(static_cast<int>(p.p * 100)) +
         (p.order == kernels::ResidualOrder::pre_ln ? "_pre" : "_post");
}

constexpr auto kPost = kernels::ResidualOrder::post_ln;
constexpr auto kPre = kernels::ResidualOrder::pre_ln;
INSTANTIATE_TEST_SUITE_P(
    Shapes, BiasDropoutResidualLayerNormTorchTest,
    ::testing::Values(
        Param{kernels::DType::f32, 300, 31, 0.1f, kPost}, Param{kernels::DType::f32, 300, 31, 0.f, kPre},
        Param{kernels::DType::f32, 8192, 768, 0.1f, kPost}, Param{kernels::DType::f16, 8192, 768, 0.1f, kPost},
        Param{kernels::DType::bf16, 8192, 768, 0.1f, kPost}, Param{kernels::DType::f16, 8192, 768, 0.f, kPost},
        Param{kernels::DType::bf16, 8192, 768, 0.f, kPre}, Param{kernels::DType::f16, 4096, 1024, 0.1f, kPre},
        Param{kernels::DType::bf16, 4096, 1024, 0.5f, kPre}, Param{kernels::DType::f16, 77, 1000, 0.5f, kPost},
        Param{kernels::DType::bf16, 33, 4096, 0.1f, kPre}, Param{kernels::DType::f16, 5, 12288, 0.1f, kPost},
        Param{kernels::DType::bf16, 3, 70000, 0.1f, kPre}, Param{kernels::DType::f16, 100000, 96, 0.1f, kPost}),
    param_name);

// The mask's statistics: the kept fraction is 1 - p within a binomial bound; a new offset draws a new
// mask (agreeing on p^2 + (1 - p)^2 of elements, as two independent masks do); the same offset
// redraws the same mask.
TEST(BiasDropoutResidualLayerNormMaskTest, KeepsOneMinusPAndFollowsTheOffset) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const int rows = 4099, columns = 1001;
  const double n = static_cast<double>(rows) * columns;
  for (float p : {0.1f, 0.5f}) {
    const kernels::Dropout dropout{p, rng(), rng() >> 16};
    const at::Tensor mask = fused_mask(kernels::DType::bf16, dropout, rows, columns);
    const double kept = mask.to(at::kDouble).sum().item<double>();
    EXPECT_NEAR(kept, n * (1 - p), 6 * std::sqrt(n * p * (1 - p))) << "p = " << p;
    EXPECT_TRUE(at::equal(mask, fused_mask(kernels::DType::bf16, dropout, rows, columns))) << "same offset";
    kernels::Dropout next = dropout;
    next.offset += 1;
    const double agree = mask.eq(fused_mask(kernels::DType::bf16, next, rows, columns)).sum().item<double>();
    const double expected = p * p + (1 - p) * (1 - p);
    EXPECT_NEAR(agree, n * expected, 6 * std::sqrt(n * expected * (1 - expected))) << "next offset, p = " << p;
  }
  const at::Tensor all = fused_mask(kernels::DType::f16, kernels::Dropout{0.f, rng(), 0}, rows, columns);
  EXPECT_EQ(all.to(at::kDouble).sum().item<double>(), n) << "p = 0 keeps every element";
}

}  // namespace
}  // namespace fusekit
