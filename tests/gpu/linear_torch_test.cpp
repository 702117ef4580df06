// The linear layer's cuBLASLt GEMMs against libtorch autograd of the baseline (at::linear, then
// at::gelu(approximate="tanh")): every output and gradient (y, pre, dpre, dx, dW, db) may be at most
// twice as far from a float64 computation as PyTorch's own result in the same dtype, with a floor
// for fp32, where both are at rounding level. Padded runs are compared on their unpadded part.
// Shapes whose stored extents are at most 64, unpadded with a feature size not a multiple of 8 or
// padded, run the skinny kernels instead of cuBLASLt.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "baselines/linear.h"
#include "gpu_test_support.h"
#include "kernels/linear.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  bool gelu;
  int rows, out_features, in_features;
  bool padded;
};

// `t` ([rows, columns] or [columns]) with zero pad rows and columns up to the padded sizes.
at::Tensor pad_to(const at::Tensor& t, int64_t rows, int64_t columns) {
  if (t.dim() == 1) return at::constant_pad_nd(t, {0, columns - t.size(0)});
  return at::constant_pad_nd(t, {0, columns - t.size(1), 0, rows - t.size(0)}).contiguous();
}

at::Tensor unpad(const at::Tensor& t, int64_t rows, int64_t columns) {
  if (t.dim() == 1) return t.narrow(0, 0, columns);
  return t.narrow(0, 0, rows).narrow(1, 0, columns);
}

class LinearTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(LinearTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const int64_t M = p.rows, N = p.out_features, K = p.in_features;
  const kernels::LinearShape shape{p.rows, p.out_features, p.in_features, p.padded};
  const int64_t Ns = shape.out_stride(), Ks = shape.in_stride();
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const at::Tensor x = at::randn({M, K}, options);
  const at::Tensor weight = at::randn({N, K}, options) / std::sqrt(static_cast<double>(K));
  const at::Tensor bias = at::randn({N}, options) * 0.5;
  const at::Tensor dy = at::randn({M, N}, options);                                               // bias
  const at::Tensor dz = at::randn({M, K}, options);                                               // bias_gelu: the next
  const at::Tensor weight_next = at::randn({K, N}, options) / std::sqrt(static_cast<double>(N));  // layer, N -> K

  auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const baselines::LinearGradients ref =
      p.gelu ? baselines::linear_gelu_forward_backward(d(x), d(weight), d(bias), d(dz), d(weight_next))
             : baselines::linear_forward_backward(d(x), d(weight), d(bias), d(dy));
  const baselines::LinearGradients eager =
      p.gelu ? baselines::linear_gelu_forward_backward(x, weight, bias, dz, weight_next)
             : baselines::linear_forward_backward(x, weight, bias, dy);

  const at::Tensor xp = pad_to(x, M, Ks), wp = pad_to(weight, Ns, Ks), bp = pad_to(bias, 1, Ns);
  const at::Tensor dyp = pad_to(dy, M, Ns), dzp = pad_to(dz, M, Ks), wnp = pad_to(weight_next, Ks, Ns);
  auto poisoned = [&](int64_t rows, int64_t columns) { return at::full({rows, columns}, NAN, options); };
  at::Tensor y = poisoned(M, Ns), pre = poisoned(M, Ns), dpre = poisoned(M, Ns), dx = poisoned(M, Ks);
  at::Tensor dweight = poisoned(Ns, Ks), dbias = at::full({Ns}, NAN, options);

  kernels::LinearContext context;
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  const auto epilogue = p.gelu ? kernels::LinearEpilogue::bias_gelu : kernels::LinearEpilogue::bias;
  kernels::linear_forward(context, p.dtype, epilogue, shape, xp.data_ptr(), wp.data_ptr(), bp.data_ptr(), y.data_ptr(),
                          pre.data_ptr(), stream);
  if (p.gelu) {
    const kernels::LinearShape next{p.rows, p.in_features, p.out_features, p.padded};
    kernels::linear_gelu_backward_input(context, p.dtype, next, dzp.data_ptr(), wnp.data_ptr(), pre.data_ptr(),
                                        dpre.data_ptr(), dbias.data_ptr(), stream);
    kernels::linear_backward(context, p.dtype, shape, dpre.data_ptr(), xp.data_ptr(), wp.data_ptr(), dx.data_ptr(),
                             dweight.data_ptr(), nullptr, stream);
  } else {
    kernels::linear_backward(context, p.dtype, shape, dyp.data_ptr(), xp.data_ptr(), wp.data_ptr(), dx.data_ptr(),
                             dweight.data_ptr(), dbias.data_ptr(), stream);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  expect_within_twice_eager("y", unpad(y, M, N), eager.y, ref.y, floor);
  if (p.gelu) {
    expect_within_twice_eager("pre", unpad(pre, M, N), eager.pre, ref.pre, floor);
    expect_within_twice_eager("dpre", unpad(dpre, M, N), eager.dpre, ref.dpre, floor);
  }
  expect_within_twice_eager("dx", unpad(dx, M, K), eager.dx, ref.dx, floor);
  expect_within_twice_eager("dweight", unpad(dweight, N, K), eager.dweight, ref.dweight, floor);
  expect_within_twice_eager("dbias", unpad(dbias, 1, N), eager.dbias, ref.dbias, floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + (p.gelu ? "_bias_gelu_" : "_bias_") + std::to_string(p.rows) +
         "x" + std::to_string(p.out_features) + "x" + std::to_string(p.in_features) + (p.padded ? "_padded" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTorchTest,
                         ::testing::Values(Param{kernels::DType::f16, true, 2048, 3072, 768, false},
                                           Param{kernels::DType::f16, false, 2048, 768, 3072, false},
                                           Param{kernels::DType::bf16, true, 2048, 3072, 768, false},
                                           Param{kernels::DType::bf16, false, 2048, 768, 3072, false},
                                           Param{kernels::DType::f16, false, 333, 49, 32, false},
                                           Param{kernels::DType::f16, false, 333, 49, 32, true},
                                           Param{kernels::DType::bf16, true, 333, 49, 49, true},
                                           Param{kernels::DType::f16, true, 1, 56, 49, true},
                                           Param{kernels::DType::f32, true, 300, 256, 128, false},
                                           Param{kernels::DType::f32, false, 7, 49, 768, false},
                                           // Unpadded odd sizes <= 64: the skinny kernels (kernels/skinny_linear.cu).
                                           Param{kernels::DType::bf16, false, 4099, 32, 49, false},
                                           Param{kernels::DType::f16, false, 65537, 49, 32, false},
                                           Param{kernels::DType::f32, false, 1000, 7, 63, false}),
                         param_name);

}  // namespace
}  // namespace fusekit
