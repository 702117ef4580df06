// BERT attention, fused forward and backward with p = 0, against libtorch autograd of the eager
// baseline (HuggingFace's composition with the additive mask): out, dqkv and each of dq, dk, dv. The
// fused result may be at most twice as far from the baseline's float64 run as PyTorch eager's own
// result in the same dtype (the FlashAttention rule), or DESIGN's fp32 bound where eager is exact
// (one key). Valid lengths are random in [1, seq] with the first sequence fully valid: the
// baseline's finite mask gives a sequence without valid keys uniform attention where the kernels
// give 0 (kernels/bert_attention.h), so none is drawn here. The suite's SDPA baseline is held to
// the same rule against the eager baseline's float64 run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "baselines/bert_attention.h"
#include "gpu_test_support.h"
#include "kernels/bert_attention.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  int batch;
  int heads;
  int seq;
  int head_dim;
};

// Fresh random inputs (valid lengths in [1, seq], the first sequence fully valid) and the eager
// baseline's forward + backward on them, in float64 (the reference) and in the inputs' dtype.
struct Case {
  at::Tensor qkv, dout, lengths;
  double scale;
  baselines::BertAttentionGradients ref, eager;
};

Case eager_case(const Param& p) {
  Case c;
  c.scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  c.qkv = at::randn({p.batch, p.seq, 3, p.heads, p.head_dim}, options);
  c.dout = at::randn({p.batch, p.seq, p.heads * p.head_dim}, options);
  c.lengths = at::randint(1, p.seq + 1, {p.batch}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
  c.lengths.index_put_({0}, p.seq);
  c.ref = baselines::bert_attention_forward_backward(c.qkv.to(at::kDouble),
                                                     baselines::bert_additive_mask(c.lengths, p.seq, at::kDouble),
                                                     c.scale, 0.0, c.dout.to(at::kDouble));
  c.eager = baselines::bert_attention_forward_backward(
      c.qkv, baselines::bert_additive_mask(c.lengths, p.seq, c.qkv.scalar_type()), c.scale, 0.0, c.dout);
  return c;
}

class BertAttentionTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(BertAttentionTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const kernels::BertAttentionShape shape{p.batch, p.heads, p.seq, p.head_dim};
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  const Case c = eager_case(p);
  const at::Tensor &qkv = c.qkv, &dout = c.dout, &lengths = c.lengths;
  const double scale = c.scale;
  const auto &ref = c.ref, &eager = c.eager;

  at::Tensor out = at::full({p.batch, p.seq, p.heads * p.head_dim}, NAN, options);
  at::Tensor dqkv = at::full_like(qkv, NAN);
  at::Tensor lse = at::full({p.batch, p.heads, p.seq}, NAN, float_options);
  at::Tensor workspace =
      at::full({static_cast<int64_t>(kernels::bert_attention_backward_workspace_bytes(shape) / 4)}, NAN, float_options);
  const kernels::BertAttentionDropout no_dropout{};
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::bert_attention_forward(p.dtype, qkv.data_ptr(), lengths.data_ptr<int32_t>(), out.data_ptr(),
                                  lse.data_ptr<float>(), shape, static_cast<float>(scale), no_dropout, stream);
  kernels::bert_attention_backward(p.dtype, qkv.data_ptr(), lengths.data_ptr<int32_t>(), out.data_ptr(),
                                   lse.data_ptr<float>(), dout.data_ptr(), dqkv.data_ptr(), workspace.data_ptr(), shape,
                                   static_cast<float>(scale), no_dropout, stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // A floor where eager's error vanishes: with one key (seq = 1) P = 1, eager's out and dV are exact
  // and its softmax backward P (dP - sum P dP) cancels to exactly 0, so twice its error is 0. The
  // fused backward forms dP = dO . V and D = dO . O (= dO . V here) as the same dot product summed in
  // two orders, in float, so its dS is 0 only to float's rounding: DESIGN's fp32 bound is the floor
  // (as in adamw_torch_test.cpp), far below eager's error in fp16 and bf16 wherever that is not 0.
  const double floor = 1e-5;
  expect_within_twice_eager("out", out, eager.out, ref.out, floor);
  expect_within_twice_eager("dqkv", dqkv, eager.dqkv, ref.dqkv, floor);
  // Each part on its own, so that a wrong dq, dk or dv shows by name. A part whose reference is
  // exactly 0 (dq and dk at seq = 1) has no size of its own to measure an error against (relative_error
  // would return an absolute one, which grows with the shape): it is measured against the size of the
  // whole gradient, as the dqkv check above measures it.
  const double whole = ref.dqkv.norm().item<double>();
  const char* names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {
    const at::Tensor want = ref.dqkv.select(2, part);
    const double unit = want.norm().item<double>() > 0 || whole == 0 ? 1.0 : whole;
    expect_within_twice_eager(names[part], dqkv.select(2, part).to(at::kDouble) / unit,
                              eager.dqkv.select(2, part).to(at::kDouble) / unit, want / unit, floor);
  }
}

// The suite's baseline:sdpa (libtorch's scaled_dot_product_attention on views of the packed qkv,
// a boolean key mask) computes the same attention as the eager baseline: its out and dqkv within
// twice eager's own error of the float64 eager run.
TEST(BertAttentionSdpaBaseline, MatchesTheFloat64EagerBaseline) {
  FUSEKIT_REQUIRE_GPU();
  for (const Param& p : {Param{kernels::DType::f16, 8, 12, 128, 64}, Param{kernels::DType::bf16, 3, 4, 77, 32}}) {
    SCOPED_TRACE(kernels::dtype_name(p.dtype));
    const Case c = eager_case(p);
    const auto sdpa = baselines::bert_attention_sdpa_forward_backward(c.qkv, baselines::bert_key_mask(c.lengths, p.seq),
                                                                      c.scale, 0.0, c.dout);
    const auto &ref = c.ref, &eager = c.eager;
    expect_within_twice_eager("sdpa out", sdpa.out, eager.out, ref.out, 1e-5);
    expect_within_twice_eager("sdpa dqkv", sdpa.dqkv, eager.dqkv, ref.dqkv, 1e-5);
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + "_" + std::to_string(p.batch) + "x" + std::to_string(p.heads) +
         "x" + std::to_string(p.seq) + "x" + std::to_string(p.head_dim);
}

using kernels::DType;
INSTANTIATE_TEST_SUITE_P(Shapes, BertAttentionTorchTest,
                         ::testing::Values(Param{DType::f16, 8, 12, 128, 64}, Param{DType::bf16, 8, 12, 128, 64},
                                           Param{DType::f16, 4, 16, 512, 64}, Param{DType::bf16, 2, 4, 512, 64},
                                           Param{DType::f16, 3, 4, 77, 32}, Param{DType::bf16, 3, 2, 333, 128},
                                           Param{DType::f16, 2, 2, 333, 128}, Param{DType::f16, 4, 3, 1, 64}),
                         param_name);

}  // namespace
}  // namespace fusekit
