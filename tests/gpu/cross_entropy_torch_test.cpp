// Cross-entropy's fused forward and backward against libtorch autograd of the baseline
// (at::cross_entropy_loss on the storage-dtype logits). The fused result may be at most twice as far
// from a float64 computation as PyTorch's own result in the same dtype (the FlashAttention rule),
// with a floor for fp32, where both are at rounding level. Compared: the mean loss, the per-row
// losses (reduction "none"), logsumexp, the count of rows not ignored, and dlogits; about 10% of the
// labels are ignore_index, and some cases mask 10% of the vocabulary with -inf.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "baselines/cross_entropy.h"
#include "gpu_test_support.h"
#include "kernels/cross_entropy.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

constexpr int64_t kIgnore = -100;

struct Param {
  kernels::DType dtype;
  int rows;
  int vocab;
  double smoothing;
  bool masked;  // 10% of the logits -inf (never a label's): with smoothing, those rows' losses are +inf
};

class CrossEntropyTorchTest : public ::testing::TestWithParam<Param> {};

// Where the float64 result is infinite, fused and eager must be the same infinity; over the rest,
// the fused error is at most max(2 x eager error, floor).
void expect_close(const char* name, const at::Tensor& fused, const at::Tensor& eager, const at::Tensor& ref,
                  double floor) {
  const at::Tensor finite = at::isfinite(ref);
  const at::Tensor infinite = at::logical_not(finite);
  EXPECT_TRUE(at::equal(fused.to(at::kDouble).masked_select(infinite), ref.masked_select(infinite)))
      << name << ": infinities differ from float64";
  EXPECT_TRUE(at::equal(eager.to(at::kDouble).masked_select(infinite), ref.masked_select(infinite)))
      << name << ": PyTorch eager's infinities differ from float64";
  expect_within_twice_eager(name, fused.masked_select(finite), eager.masked_select(finite), ref.masked_select(finite),
                            floor);
}

TEST_P(CrossEntropyTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(at::kCUDA);
  at::Tensor labels = at::randint(p.vocab, {p.rows}, long_options);
  labels = at::where(at::rand({p.rows}, float_options) < 0.1, at::full_like(labels, kIgnore), labels);
  labels.narrow(0, 0, 1).fill_(p.vocab - 1);  // one row counts: with none, PyTorch's mean is NaN, fusekit's 0
  at::Tensor logits = at::randn({p.rows, p.vocab}, options) * 3;
  if (p.masked) {
    at::Tensor mask = at::rand({p.rows, p.vocab}, float_options) < 0.1;
    mask.scatter_(1, labels.clamp_min(0).unsqueeze(1), false);
    logits.masked_fill_(mask, -INFINITY);
  }
  // dloss / count of order 1, as a loss scaler keeps it in fp16 training, and representable in the
  // storage dtype, so that the eager backward (which takes it in the loss's dtype) sees the same value.
  const int64_t count = (labels != kIgnore).sum().item<int64_t>();
  const at::Tensor dloss = at::full({}, 1.25 * std::max<int64_t>(count, 1), options);

  const auto ref_losses = baselines::cross_entropy_losses(logits.to(at::kDouble), labels, kIgnore, p.smoothing);
  const auto ref = baselines::cross_entropy_forward_backward(logits.to(at::kDouble), labels, kIgnore, p.smoothing,
                                                             dloss.to(at::kDouble));
  const auto eager_losses = baselines::cross_entropy_losses(logits, labels, kIgnore, p.smoothing);
  const auto eager = baselines::cross_entropy_forward_backward(logits, labels, kIgnore, p.smoothing, dloss);

  at::Tensor losses = at::full({p.rows}, NAN, float_options), lse = at::full({p.rows}, NAN, float_options);
  at::Tensor mean = at::full({}, NAN, float_options);
  at::Tensor valid_rows = at::full({}, -1, at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
  at::Tensor dlogits = at::full_like(logits, NAN);
  const at::Tensor dloss_float = dloss.to(at::kFloat);
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::cross_entropy_forward(p.dtype, logits.data_ptr(), labels.data_ptr<int64_t>(), losses.data_ptr<float>(),
                                 lse.data_ptr<float>(), mean.data_ptr<float>(), valid_rows.data_ptr<int>(), p.rows,
                                 p.vocab, kIgnore, static_cast<float>(p.smoothing), stream);
  kernels::cross_entropy_backward(p.dtype, logits.data_ptr(), labels.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                  valid_rows.data_ptr<int>(), dloss_float.data_ptr<float>(), dlogits.data_ptr(), p.rows,
                                  p.vocab, kIgnore, static_cast<float>(p.smoothing), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // The fused losses are float in every dtype, where PyTorch's are in the storage dtype: their floor
  // is fp32's bound (PyTorch's rounding error could be near 0 by chance for one scalar).
  const double loss_floor = 1e-5;
  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  EXPECT_EQ(valid_rows.item<int>(), count);
  expect_close("mean loss", mean, eager.loss, ref.loss, loss_floor);
  expect_close("losses", losses, eager_losses, ref_losses, loss_floor);
  expect_close("dlogits", dlogits, eager.dlogits, ref.dlogits, floor);
  // PyTorch exposes no logsumexp of its own here; the fused one is float arithmetic on the stored
  // logits, so it meets fp32's bound in every dtype.
  const at::Tensor ref_lse = at::logsumexp(logits.to(at::kDouble), {1});
  EXPECT_LT(relative_error(lse, ref_lse), 1e-5) << "logsumexp";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + "_" + std::to_string(p.rows) + "x" + std::to_string(p.vocab) +
         (p.smoothing > 0 ? "_smoothing" : "") + (p.masked ? "_masked" : "");
}

using kernels::DType;
INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropyTorchTest,
    ::testing::Values(Param{DType::f32, 300, 31, 0.0, false}, Param{DType::f32, 1280, 30522, 0.1, false},
                      Param{DType::f16, 1280, 30522, 0.1, false}, Param{DType::bf16, 1280, 30522, 0.1, false},
                      Param{DType::bf16, 1280, 30522, 0.0, false}, Param{DType::f16, 128, 1000, 0.1, false},
                      Param{DType::bf16, 128, 21841, 0.1, false}, Param{DType::bf16, 256, 50257, 0.1, false},
                      Param{DType::f16, 64, 65536, 0.0, false}, Param{DType::f16, 4096, 8, 0.1, false},
                      Param{DType::bf16, 1, 50257, 0.0, false}, Param{DType::bf16, 512, 30522, 0.0, true},
                      Param{DType::f16, 512, 1000, 0.1, true}, Param{DType::f32, 64, 50257, 0.1, true}),
    param_name);

}  // namespace
}  // namespace fusekit
