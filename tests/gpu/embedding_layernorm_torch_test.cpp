// Embedding + LayerNorm + dropout's fused forward and backward against libtorch autograd of the
// baseline (three at::embedding, at::layer_norm, dropout). PyTorch's dropout RNG cannot draw
// fusekit's mask, so for p > 0 the baseline runs with the fused kernels' own mask: the dropout stream
// is bias_dropout_residual_layernorm's (element r * H + c), so its test-only mask writer draws it. At
// p = 0 the baseline is the plain eager composition. Every gradient (the three tables, gamma, beta)
// and y may be at most twice as far from a float64 computation as PyTorch's own result in the same
// dtype (the FlashAttention rule), with a floor for fp32, where both are at rounding level.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <random>
#include <string>

#include "baselines/embedding_layernorm.h"
#include "gpu_test_support.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/embedding_layernorm.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  int tokens;
  int hidden;
  int vocab;
  float p;
  bool counted = false;  // the forward counts the ids in the backward's workspace (training)
};

constexpr int kPositions = 512, kTypes = 2;

class EmbeddingLayerNormTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(EmbeddingLayerNormTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const double eps = 1e-5;
  std::mt19937_64 rng(std::random_device{}());
  const kernels::Dropout dropout{p.p, rng(), rng() >> 16};
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const auto id_options = at::TensorOptions().dtype(at::kLong).device(at::kCUDA);
  baselines::EmbeddingLayerNormInputs in;
  // Word ids from a small range of the vocabulary, so rows repeat and others stay unused.
  in.word_ids = at::randint(0, std::min(p.vocab, 1 + p.tokens / 4), {p.tokens}, id_options);
  in.position_ids = at::arange(p.tokens, id_options).remainder(kPositions);
  in.token_type_ids = at::randint(0, kTypes, {p.tokens}, id_options);
  in.word = at::randn({p.vocab, p.hidden}, options);
  in.position = at::randn({kPositions, p.hidden}, options);
  in.token_type = at::randn({kTypes, p.hidden}, options);
  in.gamma = at::randn({p.hidden}, options) * 0.2 + 1;
  in.beta = at::randn({p.hidden}, options) * 0.1;
  const at::Tensor dy = at::randn({p.tokens, p.hidden}, options);

  at::Tensor mask;
  if (p.p > 0) {
    mask = at::full({p.tokens, p.hidden}, NAN, options);
    kernels::bias_dropout_residual_layernorm_mask(p.dtype, dropout, mask.data_ptr(), p.tokens, p.hidden, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  baselines::EmbeddingLayerNormInputs in64 = in;
  for (at::Tensor* t : {&in64.word, &in64.position, &in64.token_type, &in64.gamma, &in64.beta}) *t = t->to(at::kDouble);
  const auto ref = baselines::embedding_layernorm_forward_backward(in64, dy.to(at::kDouble), p.p, eps,
                                                                   mask.defined() ? mask.to(at::kDouble) : mask);
  const auto eager = baselines::embedding_layernorm_forward_backward(in, dy, p.p, eps, mask);

  at::Tensor y = at::full_like(dy, NAN), dword = at::full_like(in.word, NAN),
             dposition = at::full_like(in.position, NAN), dtoken_type = at::full_like(in.token_type, NAN),
             dgamma = at::full_like(in.gamma, NAN), dbeta = at::full_like(in.beta, NAN);
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor mean = at::full({p.tokens}, NAN, float_options), rstd = at::full({p.tokens}, NAN, float_options);
  const kernels::EmbeddingLayerNormSizes sizes{p.tokens, p.hidden, p.vocab, kPositions, kTypes};
  at::Tensor workspace = at::empty({static_cast<int64_t>(kernels::embedding_layernorm_backward_workspace_bytes(sizes))},
                                   at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::EmbeddingLayerNormForwardTensors forward;
  forward.word_ids = in.word_ids.data_ptr<int64_t>();
  forward.position_ids = in.position_ids.data_ptr<int64_t>();
  forward.token_type_ids = in.token_type_ids.data_ptr<int64_t>();
  forward.word = in.word.data_ptr();
  forward.position = in.position.data_ptr();
  forward.token_type = in.token_type.data_ptr();
  forward.gamma = in.gamma.data_ptr();
  forward.beta = in.beta.data_ptr();
  forward.y = y.data_ptr();
  forward.mean = mean.data_ptr<float>();
  forward.rstd = rstd.data_ptr<float>();
  if (p.counted) forward.backward_workspace = workspace.data_ptr();
  kernels::embedding_layernorm_forward(p.dtype, forward, dropout, sizes, static_cast<float>(eps), stream);
  kernels::EmbeddingLayerNormBackwardTensors backward;
  backward.dy = dy.data_ptr();
  backward.word_ids = forward.word_ids;
  backward.position_ids = forward.position_ids;
  backward.token_type_ids = forward.token_type_ids;
  backward.word = forward.word;
  backward.position = forward.position;
  backward.token_type = forward.token_type;
  backward.gamma = forward.gamma;
  backward.mean = forward.mean;
  backward.rstd = forward.rstd;
  backward.dword = dword.data_ptr();
  backward.dposition = dposition.data_ptr();
  backward.dtoken_type = dtoken_type.data_ptr();
  backward.dgamma = dgamma.data_ptr();
  backward.dbeta = dbeta.data_ptr();
  backward.ids_counted = p.counted;
  kernels::embedding_layernorm_backward(p.dtype, backward, dropout, sizes, workspace.data_ptr(), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  expect_within_twice_eager("y", y, eager.y, ref.y, floor);
  expect_within_twice_eager("dword", dword, eager.dword, ref.dword, floor);
  expect_within_twice_eager("dposition", dposition, eager.dposition, ref.dposition, floor);
  expect_within_twice_eager("dtoken_type", dtoken_type, eager.dtoken_type, ref.dtoken_type, floor);
  expect_within_twice_eager("dgamma", dgamma, eager.dgamma, ref.dgamma, floor);
  expect_within_twice_eager("dbeta", dbeta, eager.dbeta, ref.dbeta, floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + "_" + std::to_string(p.tokens) + "x" + std::to_string(p.hidden) +
         "_v" + std::to_string(p.vocab) + "_p" + std::to_string(static_cast<int>(p.p * 100)) +
         (p.counted ? "_counted" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingLayerNormTorchTest,
    ::testing::Values(
        Param{kernels::DType::f32, 300, 31, 97, 0.f}, Param{kernels::DType::f32, 8192, 768, 30522, 0.1f},
        Param{kernels::DType::f16, 8192, 768, 30522, 0.f}, Param{kernels::DType::f16, 8192, 768, 30522, 0.1f},
        Param{kernels::DType::bf16, 8192, 768, 30522, 0.1f}, Param{kernels::DType::f16, 4096, 1024, 30522, 0.1f},
        Param{kernels::DType::bf16, 16384, 1024, 30522, 0.f}, Param{kernels::DType::f16, 77, 1000, 500, 0.1f},
        Param{kernels::DType::bf16, 1, 768, 30522, 0.1f}, Param{kernels::DType::f16, 9, 12288, 40, 0.1f},
        Param{kernels::DType::f16, 8192, 768, 30522, 0.1f, true},
        Param{kernels::DType::bf16, 16384, 1024, 30522, 0.1f, true},
        Param{kernels::DType::f32, 8192, 768, 30522, 0.1f, true}, Param{kernels::DType::f16, 9, 12288, 40, 0.1f, true}),
    param_name);

}  // namespace
}  // namespace fusekit
