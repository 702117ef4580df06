// AdamW's fused steps against PyTorch's over 10 steps: the fp32 tensor-list step against
// at::_fused_adamw_ (torch.optim.AdamW(fused=True)), and the fp16/bf16 trainer with master weights
// against AMP's GradScaler around at::_fused_adamw_ on fp32 parameters, with an inf gradient in
// step 4 that both must skip (the scale then halves, as GradScaler's backoff does). A float64 run
// of the same baseline is the reference. The fused result may be at most twice as far from it as
// PyTorch's own result (the FlashAttention rule), with DESIGN's bound for the dtype as a floor:
// PyTorch's kernel computes the moments partly in double, far below the rounding of the fp32 they
// are stored in, so twice its error alone would demand more than float storage holds.
//
// Parameters are compared by their change over the steps, (p - p0) against (p_ref - p0): the
// change is what the optimizer computes, and it is small next to p.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "baselines/adamw.h"
#include "gpu_test_support.h"
#include "kernels/adamw.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

const baselines::AdamWHyperparameters kHyper{/*lr=*/1e-2, /*beta1=*/0.8, /*beta2=*/0.95, /*eps=*/1e-6,
                                             /*weight_decay=*/0.1};
const std::vector<int64_t> kSizes = {1, 7, 31, 4097, (int64_t{1} << 20) + 3};
constexpr int kSteps = 10;

kernels::AdamWOptions options() {
  kernels::AdamWOptions o;
  o.lr = kHyper.lr;
  o.beta1 = kHyper.beta1;
  o.beta2 = kHyper.beta2;
  o.eps = kHyper.eps;
  o.weight_decay = kHyper.weight_decay;
  return o;
}

at::TensorOptions on_gpu(at::ScalarType type) { return at::TensorOptions().dtype(type).device(at::kCUDA); }

// Gradients with magnitudes over seven decades around eps, as in adamw_test.cu.
at::Tensor random_gradient(int64_t n) {
  return at::randn({n}, on_gpu(at::kFloat)) * at::pow(10.0, at::rand({n}, on_gpu(at::kFloat)) * 7 - 7);
}

// A baseline optimizer's state: fresh copies of `params` in `type`, zero moments and steps.
baselines::AdamWTensors make_state(const std::vector<at::Tensor>& params, at::ScalarType type) {
  baselines::AdamWTensors s;
  for (const at::Tensor& p : params) {
    s.params.push_back(p.to(type).clone());
    s.grads.push_back(at::zeros_like(s.params.back()));
    s.exp_avgs.push_back(at::zeros_like(s.params.back()));
    s.exp_avg_sqs.push_back(at::zeros_like(s.params.back()));
    s.steps.push_back(at::zeros({}, on_gpu(at::kFloat)));
  }
  return s;
}

at::Tensor flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : tensors) parts.push_back(t.reshape({-1}).to(at::kDouble));
  return at::cat(parts);
}

TEST(AdamWTorchTest, TensorListMatchesFusedAdamW) {
  FUSEKIT_REQUIRE_GPU();
  std::vector<at::Tensor> p0;
  for (int64_t n : kSizes) p0.push_back(at::randn({n}, on_gpu(at::kFloat)) * 0.05);
  baselines::AdamWTensors fused = make_state(p0, at::kFloat), eager = make_state(p0, at::kFloat),
                          foreach_state = make_state(p0, at::kFloat), ref = make_state(p0, at::kDouble);
  std::vector<kernels::AdamWTensor> tensors;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    tensors.push_back({fused.params[i].data_ptr<float>(), fused.grads[i].data_ptr<float>(),
                       fused.exp_avgs[i].data_ptr<float>(), fused.exp_avg_sqs[i].data_ptr<float>(),
                       static_cast<size_t>(kSizes[i])});
  }
  const kernels::AdamWTensorList list(tensors);
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const at::Tensor g = random_gradient(kSizes[i]);
      for (baselines::AdamWTensors* s : {&fused, &eager, &foreach_state, &ref}) s->grads[i].copy_(g);
    }
    kernels::adamw_step(list, options(), step, nullptr);  // the legacy default stream, which torch uses too
    baselines::adamw_fused_step(eager, kHyper);
    baselines::adamw_foreach_step(foreach_state, kHyper, step);
    baselines::adamw_fused_step(ref, kHyper);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const at::Tensor start = flat(p0);
  const double floor = 1e-5;  // DESIGN's fp32 bound
  expect_within_twice_eager("param change", flat(fused.params) - start, flat(eager.params) - start,
                            flat(ref.params) - start, floor);
  expect_within_twice_eager("exp_avg", flat(fused.exp_avgs), flat(eager.exp_avgs), flat(ref.exp_avgs), floor);
  expect_within_twice_eager("exp_avg_sq", flat(fused.exp_avg_sqs), flat(eager.exp_avg_sqs), flat(ref.exp_avg_sqs),
                            floor);
  // The foreach sequence is PyTorch too: the fused step must sit as close to it as to the fused one.
  expect_within_twice_eager("param change vs foreach", flat(fused.params) - start, flat(foreach_state.params) - start,
                            flat(ref.params) - start, floor);
  for (const at::Tensor& s : eager.steps) EXPECT_EQ(s.item<float>(), kSteps);
}

class AdamWTrainerTorchTest : public ::testing::TestWithParam<kernels::DType> {};

TEST_P(AdamWTrainerTorchTest, MasterWeightsMatchAmpFusedAdamW) {
  FUSEKIT_REQUIRE_GPU();
  const kernels::DType dtype = GetParam();
  const at::ScalarType type = torch_type(dtype);
  constexpr int kSkippedStep = 4;
  std::vector<size_t> sizes(kSizes.begin(), kSizes.end());
  kernels::AdamWTrainer trainer(dtype, sizes, /*master_weights=*/true);
  auto view = [&](void* base, size_t element_bytes, size_t i, at::ScalarType t) {
    return at::from_blob(static_cast<char*>(base) + trainer.offset(i) * element_bytes, {kSizes[i]}, on_gpu(t));
  };
  const size_t bytes = kernels::dtype_size(dtype);

  // Parameters start representable in the 16-bit type, so that all three runs start equal.
  std::vector<at::Tensor> p0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    p0.push_back((at::randn({kSizes[i]}, on_gpu(at::kFloat)) * 0.05).to(type).to(at::kFloat));
    view(trainer.parameters(), bytes, i, type).copy_(p0.back());
  }
  trainer.load_master_weights(nullptr);
  baselines::AdamWTensors eager = make_state(p0, at::kFloat), ref = make_state(p0, at::kDouble);
  baselines::GradScalerState eager_scaler = baselines::make_grad_scaler(1024, at::kCUDA);
  baselines::GradScalerState ref_scaler = baselines::make_grad_scaler(1024, at::kCUDA);

  double scale = 1024;
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      at::Tensor stored = (random_gradient(kSizes[i]) * scale).to(type);  // what a scaled backward leaves
      if (step == kSkippedStep && i == 3) stored[1000] = INFINITY;
      view(trainer.gradients(), bytes, i, type).copy_(stored);
      eager.grads[i].copy_(stored);
      ref.grads[i].copy_(stored);
    }
    trainer.step(options(), static_cast<float>(scale), nullptr);
    baselines::adamw_fused_amp_step(eager, kHyper, eager_scaler);
    baselines::adamw_fused_amp_step(ref, kHyper, ref_scaler);
    if (step == kSkippedStep) scale /= 2;  // GradScaler's backoff
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(trainer.step_count(nullptr), kSteps - 1);
  EXPECT_EQ(eager_scaler.scale.item<float>(), scale) << "the baseline's scale did not back off as assumed";
  for (const at::Tensor& s : eager.steps) EXPECT_EQ(s.item<float>(), kSteps - 1);

  std::vector<at::Tensor> master, params, exp_avg, exp_avg_sq;
  for (size_t i = 0; i < sizes.size(); ++i) {
    master.push_back(view(trainer.master(), 4, i, at::kFloat));
    params.push_back(view(trainer.parameters(), bytes, i, type));
    exp_avg.push_back(view(trainer.exp_avg(), 4, i, at::kFloat));
    exp_avg_sq.push_back(view(trainer.exp_avg_sq(), 4, i, at::kFloat));
  }
  const at::Tensor start = flat(p0), ref_change = flat(ref.params) - start;
  expect_within_twice_eager("master change", flat(master) - start, flat(eager.params) - start, ref_change, 1e-5);
  // The 16-bit parameters against PyTorch's fp32 parameters rounded to the same type (what autocast
  // hands the next forward).
  std::vector<at::Tensor> eager_rounded;
  for (const at::Tensor& p : eager.params) eager_rounded.push_back(p.to(type));
  expect_within_twice_eager("param change", flat(params) - start, flat(eager_rounded) - start, ref_change,
                            dtype == kernels::DType::f16 ? 2e-3 : 1e-2);
  expect_within_twice_eager("exp_avg", flat(exp_avg), flat(eager.exp_avgs), flat(ref.exp_avgs), 1e-5);
  expect_within_twice_eager("exp_avg_sq", flat(exp_avg_sq), flat(eager.exp_avg_sqs), flat(ref.exp_avg_sqs), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AdamWTrainerTorchTest, ::testing::Values(kernels::DType::f16, kernels::DType::bf16),
                         [](const auto& info) { return std::string(kernels::dtype_name(info.param)); });

}  // namespace
}  // namespace fusekit
