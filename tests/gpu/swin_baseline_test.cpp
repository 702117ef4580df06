// The libtorch Swin step (baselines/models/swin_baseline.h) on the small config (swin-test: image 56,
// two stages of two blocks, C 32, 10 classes) at batch 4, from the same weights and images:
// - in float32 against timm's float32 step (scripts/peers/swin_reference.py): the same function in
//   the same precision (TF32 off on both sides), so the loss and every gradient agree to float32's
//   rounding of two op orders;
// - under AMP within twice AMP's own error against timm's float32 step, as the fused step is held;
// - the fused step (models/swin_fused.h) against the baseline's float32 step: within twice the
//   baseline's own AMP error (the equivalence the fused model is held to, with no Python needed);
// - training: the baseline's loss falls over 6 steps on one batch; over 200 steps on learnable
//   images, the fused step's loss curve tracks the baseline's.
// The timm comparisons are skipped (visibly) where python3 cannot import torch, timm and safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "baselines/models/swin_baseline.h"
#include "gpu_test_support.h"
#include "models/safetensors.h"
#include "models/swin_fused.h"
#include "models/swin_init.h"
#include "posix_files.h"
#include "swin_test_support.h"
#include "test_stream.h"

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

// The timing path (prepare_batches, enqueue_step on the caller's stream, last_loss) computes what
// step() does: two models from the same weights, one stepped directly, one enqueued.
TEST_P(SwinBaselineTest, EnqueuedStepsMatchSteps) {
  FUSEKIT_REQUIRE_GPU();
  const SwinConfig c = config();
  const SwinInitialWeights weights(c, 17, c.dtype);
  const std::vector<models::SwinBatch> batches = {random_batch(c, 18), random_batch(c, 19)};
  const test_support::NonBlockingStream stream;  // before the models: it outlives their last steps
  BaselineSwin direct(c), enqueued(c);
  direct.load_state_dict(weights.tensors());
  enqueued.load_state_dict(weights.tensors());
  enqueued.prepare_batches(batches);
  EXPECT_THROW(enqueued.enqueue_step(2, stream.stream), std::out_of_range);
  for (int i = 0; i < 2; ++i) {
    const float expected = direct.step(batches[i]);
    enqueued.enqueue_step(i, stream.stream);
    const float loss = enqueued.last_loss();  // orders itself after the enqueued step
    EXPECT_NEAR(loss, expected, 1e-4 * std::fabs(expected)) << "step " << i;
  }
  const std::vector<HostTensor> a = direct.parameters(), b = enqueued.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(models::swin_test::norm(a[i].values), 1e-6);
    EXPECT_LE(models::swin_test::distance(a[i].values, b[i].values) / scale, 1e-3) << a[i].name;
  }
}

// Images a model can learn from in 200 steps: each class has a fixed random pattern, and an image is
// its label's pattern plus noise of the same size (random images with random labels leave nothing
// to learn: the loss stays at ln(classes) and a comparison of curves says nothing).
models::SwinBatch learnable_batch(const SwinConfig& c, uint64_t seed) {
  const size_t pixels = static_cast<size_t>(c.in_channels) * c.image_size * c.image_size;
  std::mt19937_64 pattern_rng(1234);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> patterns(c.classes, std::vector<float>(pixels));
  for (auto& pattern : patterns)
    for (float& v : pattern) v = normal(pattern_rng);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> label(0, c.classes - 1);
  models::SwinBatch b;
  for (int i = 0; i < c.batch; ++i) {
    b.labels.push_back(label(rng));
    for (size_t j = 0; j < pixels; ++j) b.images.push_back(patterns[b.labels.back()][j] + normal(rng));
  }
  return b;
}

// 200 steps from the same weights and batches: the fused step's loss, averaged over each 10-step
// window, within 2% of the baseline's, or within the baseline's own AMP-vs-float32 spread where that
// is larger (no dropout here: precision is the only thing that differs between the curves).
TEST_P(SwinBaselineTest, LossCurvesTrackTheBaselineOver200Steps) {
  FUSEKIT_REQUIRE_GPU();
  SwinConfig c = config();
  c.batch = 16;
  const SwinInitialWeights weights(c, 13, c.dtype);
  models::SwinTrainOptions options;
  options.lr = 5e-4;
  constexpr int kSteps = 200, kWindow = 10;
  std::vector<std::vector<float>> losses;  // per curve, per step: printed for a window that fails
  const auto curve = [&](auto& model) {
    model.load_state_dict(weights.tensors());
    std::vector<double> windows(kSteps / kWindow, 0.0);
    losses.emplace_back();
    for (int s = 0; s < kSteps; ++s) {
      const float loss = model.step(learnable_batch(c, static_cast<uint64_t>(s)));
      EXPECT_TRUE(std::isfinite(loss)) << "step " << s;
      windows[s / kWindow] += loss / kWindow;
      losses.back().push_back(loss);
    }
    return windows;
  };
  BaselineSwin amp(c, options, BaselinePrecision::amp), fp32(c, options, BaselinePrecision::fp32);
  models::FusedSwin fused(c, options);
  const std::vector<double> b = curve(amp), r = curve(fp32), f = curve(fused);
  EXPECT_LT(b.back(), b.front() - 0.5) << "the baseline does not learn: the test says nothing";
  for (size_t w = 0; w < f.size(); ++w) {
    const double allowed = std::max(0.02 * b[w], std::fabs(b[w] - r[w]));
    EXPECT_LE(std::fabs(f[w] - b[w]), allowed) << "steps " << w * kWindow << ".." << (w + 1) * kWindow - 1 << ": fused "
                                               << f[w] << ", baseline " << b[w] << " (float32 " << r[w] << ")";
    std::printf("window %2zu: baseline %.4f (float32 %.4f), fused %.4f\n", w, b[w], r[w], f[w]);
    if (std::fabs(f[w] - b[w]) > allowed) {
      for (size_t s = w * kWindow; s < (w + 1) * kWindow; ++s)
        std::printf("  step %3zu: baseline %.4f (float32 %.4f), fused %.4f\n", s, losses[0][s], losses[1][s],
                    losses[2][s]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwinBaselineTest, ::testing::Values(kernels::DType::f16, kernels::DType::bf16),
                         [](const auto& info) { return std::string(kernels::dtype_name(info.param)); });

}  // namespace
}  // namespace fusekit::baselines
