// The libtorch Swin step (baselines/models/swin_baseline.h) on the small config (swin-test: image 56,
// two stages of two blocks, C 32, 10 classes) at batch 4, from the same weights and images:
// - in float32 against timm's float32 step (scripts/peers/swin_reference.py): the same function in
//   the same precision (TF32 off on both sides), so the loss and every gradient agree to float32's
//   rounding of two op orders;
// - under AMP within twice AMP's own error against timm's float32 step, as the fused step is held;
// - the fused step (models/swin_fused.h) against the baseline's float32 step: within twice the
//   baseline's own AMP error (the equivalence the fused model is held to, with no Python needed);
// - training: the baseline's loss falls over 6 steps on one batch.
// The timm comparisons are skipped (visibly) where python3 cannot import torch, timm and safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "baselines/models/swin_baseline.h"
#include "gpu_test_support.h"
#include "models/safetensors.h"
#include "models/swin_fused.h"
#include "models/swin_init.h"
#include "posix_files.h"
#include "swin_test_support.h"

namespace fusekit::baselines {
namespace {

using models::HostTensor;
using models::SwinConfig;
using models::SwinInitialWeights;
using models::swin_test::floats_of;
using models::swin_test::random_batch;

// Gradients by name, as the reference functions of expect_within_amp_error take them.
struct ByName {
  const std::vector<HostTensor>* tensors;
  std::vector<float> operator()(const std::string& name) const {
    for (const HostTensor& t : *tensors) {
      if (t.name == name) return t.values;
    }
    ADD_FAILURE() << "no gradient " << name;
    return {};
  }
};

double floor_of(kernels::DType dtype) { return dtype == kernels::DType::f16 ? 2e-3 : 1e-2; }  // DESIGN.md's

class SwinBaselineTest : public ::testing::TestWithParam<kernels::DType> {
 protected:
  SwinConfig config() const {
    return models::parse_swin_config(std::string("swin-test:b4:") + models::dtype_spec_name(GetParam()));
  }
};

TEST_P(SwinBaselineTest, MatchesTimmInFloat32AndWithinAmpsErrorUnderAmp) {
  FUSEKIT_REQUIRE_GPU();
  const auto [python_status, python_output] = test_support::run_command("python3 -c 'import torch, timm, safetensors'");
  if (python_status != 0) GTEST_SKIP() << "no timm reference: " << python_output;
  const SwinConfig c = config();
  const SwinInitialWeights weights(c, 7, c.dtype);
  const models::SwinBatch batch = random_batch(c, 8);
  const test_support::TempDir dir("fusekit_swin_baseline_");
  const auto [status, output] = models::swin_test::run_timm_reference(c, weights.tensors(), batch, dir);
  ASSERT_EQ(status, 0) << output;
  const models::SafetensorsFile reference = models::SafetensorsFile::read(dir.file("reference.safetensors"));
  const auto fp32_of = [&](const std::string& name) { return floats_of(reference, "fp32." + name); };
  const auto amp_of = [&](const std::string& name) { return floats_of(reference, "amp." + name); };
  const float timm_fp32 = fp32_of("loss").at(0), timm_amp = amp_of("loss").at(0);

  BaselineSwin fp32(c, {}, BaselinePrecision::fp32);
  fp32.load_state_dict(weights.tensors());
  const float fp32_loss = fp32.forward_backward(batch);
  EXPECT_NEAR(fp32_loss, timm_fp32, 1e-4 * std::fabs(timm_fp32)) << "baseline float32 vs timm float32";
  const std::vector<HostTensor> fp32_gradients = fp32.gradients();
  double mean_norm = 0;
  for (const HostTensor& g : fp32_gradients) {
    mean_norm += models::swin_test::norm(fp32_of(g.name)) / static_cast<double>(fp32_gradients.size());
  }
  for (const HostTensor& g : fp32_gradients) {
    const std::vector<float> r = fp32_of(g.name);
    ASSERT_EQ(r.size(), g.values.size()) << g.name;
    const double scale = std::max(models::swin_test::norm(r), 1e-3 * mean_norm);
    EXPECT_LE(models::swin_test::distance(g.values, r) / scale, 2e-3) << "baseline float32 vs timm float32 " << g.name;
  }

  BaselineSwin amp(c, {}, BaselinePrecision::amp);
  amp.load_state_dict(weights.tensors());
  const float amp_loss = amp.forward_backward(batch);
  EXPECT_LE(std::fabs(amp_loss - timm_fp32),
            std::max(2.0 * std::fabs(timm_amp - timm_fp32), floor_of(c.dtype) * std::fabs(timm_fp32)))
      << "baseline AMP " << amp_loss << ", timm float32 " << timm_fp32 << ", timm AMP " << timm_amp;
  models::swin_test::expect_within_amp_error(amp.gradients(), fp32_of, amp_of, floor_of(c.dtype), "baseline AMP");
}

TEST_P(SwinBaselineTest, FusedStepIsWithinTheBaselinesAmpError) {
  FUSEKIT_REQUIRE_GPU();
  const SwinConfig c = config();
  const SwinInitialWeights weights(c, 11, c.dtype);
  const models::SwinBatch batch = random_batch(c, 12);
  BaselineSwin fp32(c, {}, BaselinePrecision::fp32), amp(c, {}, BaselinePrecision::amp);
  fp32.load_state_dict(weights.tensors());
  amp.load_state_dict(weights.tensors());
  const float fp32_loss = fp32.forward_backward(batch), amp_loss = amp.forward_backward(batch);
  const std::vector<HostTensor> fp32_gradients = fp32.gradients(), amp_gradients = amp.gradients();

  models::FusedSwin fused(c);
  fused.load_state_dict(weights.tensors());
  const float fused_loss = fused.forward_backward(batch);
  EXPECT_LE(std::fabs(fused_loss - fp32_loss),
            std::max(2.0 * std::fabs(amp_loss - fp32_loss), floor_of(c.dtype) * std::fabs(fp32_loss)))
      << "fused " << fused_loss << ", baseline float32 " << fp32_loss << ", baseline AMP " << amp_loss;
  models::swin_test::expect_within_amp_error(fused.gradients(), ByName{&fp32_gradients}, ByName{&amp_gradients},
                                             floor_of(c.dtype), "fused vs baseline");
}

TEST_P(SwinBaselineTest, TrainingLowersTheLoss) {
  FUSEKIT_REQUIRE_GPU();
  SwinConfig c = config();
  c.batch = 8;
  const SwinInitialWeights weights(c, 9, c.dtype);
  const models::SwinBatch batch = random_batch(c, 10);
  BaselineSwin model(c);
  model.load_state_dict(weights.tensors());
  std::vector<float> losses;
  for (int i = 0; i < 6; ++i) losses.push_back(model.step(batch));  // one batch, memorized
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_STREQ(model.variant(), "baseline");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwinBaselineTest, ::testing::Values(kernels::DType::f16, kernels::DType::bf16),
                         [](const auto& info) { return std::string(kernels::dtype_name(info.param)); });

}  // namespace
}  // namespace fusekit::baselines
