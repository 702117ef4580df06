// The fused Swin step (models/swin_fused.h) against timm's SwinTransformer: one forward and backward
// of the small config (swin-test: image 56, two stages of two blocks, C 32, heads 1 and 2, 10 classes;
// stage 0 shifts its odd block, stage 1 is one window) at batch 4, in fp16 and bf16, from the same
// weights (models/swin_init.h) and images. scripts/peers/swin_reference.py gives timm's loss and
// gradients in float32 and under AMP; the fused step's loss and every gradient must lie within twice
// AMP's own error against float32 (a floor for gradients that are rounding noise: 1e-3 of the mean
// gradient norm); its decaying parameters are those timm's optimizer factory decays. Then 5
// training steps lower the loss, and the step allocates nothing after the first.
// Skipped (visibly) where python3 cannot import torch, timm and safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_support.h"
#include "models/safetensors.h"
#include "models/swin_fused.h"
#include "models/swin_init.h"
#include "posix_files.h"
#include "swin_test_support.h"

namespace fusekit::models {
namespace {

using swin_test::floats_of;
using swin_test::random_batch;
using test_support::run_command;

class SwinModelTest : public ::testing::TestWithParam<kernels::DType> {};

TEST_P(SwinModelTest, OneStepMatchesTimmWithinAmpsError) {
  FUSEKIT_REQUIRE_GPU();
  const auto [python_status, python_output] = run_command("python3 -c 'import torch, timm, safetensors'");
  if (python_status != 0) GTEST_SKIP() << "no timm reference: " << python_output;
  const kernels::DType dtype = GetParam();
  const SwinConfig config = parse_swin_config(std::string("swin-test:b4:") + dtype_spec_name(dtype));
  const SwinInitialWeights weights(config, 7, dtype);
  const SwinBatch batch = random_batch(config, 8);
  const test_support::TempDir dir("fusekit_swin_model_");
  const auto [status, output] = swin_test::run_timm_reference(config, weights.tensors(), batch, dir);
  ASSERT_EQ(status, 0) << output;
  const SafetensorsFile reference = SafetensorsFile::read(dir.file("reference.safetensors"));

  // The parameters the fused trainer decays are the ones timm's optimizer factory decays.
  const SwinParameterLayout layout(config, kernels::DType::f32);
  for (const SwinParameter& p : layout.parameters()) {
    const std::vector<float> decays = floats_of(reference, "decay." + p.name);
    ASSERT_EQ(decays.size(), 1u) << p.name;
    EXPECT_EQ(p.decays, decays[0] == 1.f)
        << p.name << ": timm " << (decays[0] == 1.f ? "decays" : "does not decay") << " it";
  }

  FusedSwin model(config);
  model.load_state_dict(weights.tensors());
  const float loss = model.forward_backward(batch);
  const float fp32_loss = floats_of(reference, "fp32.loss").at(0), amp_loss = floats_of(reference, "amp.loss").at(0);
  const double floor = dtype == kernels::DType::f16 ? 2e-3 : 1e-2;  // DESIGN.md's bounds
  EXPECT_LE(std::fabs(loss - fp32_loss), std::max(2.0 * std::fabs(amp_loss - fp32_loss), floor * fp32_loss))
      << "fused " << loss << ", timm float32 " << fp32_loss << ", timm AMP " << amp_loss;

  swin_test::expect_within_amp_error(
      model.gradients(), [&](const std::string& name) { return floats_of(reference, "fp32." + name); },
      [&](const std::string& name) { return floats_of(reference, "amp." + name); }, floor, "fused vs timm");
}

TEST_P(SwinModelTest, TrainingLowersTheLoss) {
  FUSEKIT_REQUIRE_GPU();
  const kernels::DType dtype = GetParam();
  const SwinConfig config = parse_swin_config(std::string("swin-test:b8:") + dtype_spec_name(dtype));
  const SwinInitialWeights weights(config, 9, dtype);
  const SwinBatch batch = random_batch(config, 10);
  SwinTrainOptions options;
  options.lr = 1e-3;
  FusedSwin model(config, options);
  model.load_state_dict(weights.tensors());
  std::vector<float> losses;
  for (int i = 0; i < 6; ++i) losses.push_back(model.step(batch));  // one batch, memorized
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front());
  // Every buffer was planned: a step allocates no device memory.
  size_t before_free = 0, after_free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&before_free, &total), cudaSuccess);
  model.step(batch);
  ASSERT_EQ(cudaMemGetInfo(&after_free, &total), cudaSuccess);
  EXPECT_EQ(before_free, after_free);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwinModelTest, ::testing::Values(kernels::DType::f16, kernels::DType::bf16),
                         [](const auto& info) { return std::string(kernels::dtype_name(info.param)); });

}  // namespace
}  // namespace fusekit::models
