// The fused BERT MLM step against the libtorch baseline (models/bert_model.h's function), on the
// small config the issue names (2 layers, hidden 128, 2 heads, FFN 512, vocab 30522), with padding:
// - gradients after one step: every parameter's gradient of the fused step (fp16, bf16) against the
//   baseline run in fp32, within twice the error of the baseline's own AMP run against that
//   reference (plus a floor of 2 storage ulps' worth for tensors the AMP run gets almost exactly);
// - 200 steps from the same weights and data with dropout 0.1: the fused loss, averaged over each
//   10-step window, within 2% of the baseline's on the same dropout masks (regenerated on the host
//   from the fused run's Philox streams) or within the spread of two baseline runs that differ only
//   in their dropout seed, whichever is larger; and the fused run on its own masks against the
//   baseline on torch's over the last 100 steps, by the same measure;
// - dropout: a step's masks differ from the last step's, and the same seed gives the same losses;
// - a step whose gradients overflow is skipped.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "baselines/models/bert_baseline.h"
#include "gpu_test_support.h"
#include "kernels/detail/philox.cuh"
#include "models/bert_checkpoint.h"
#include "models/bert_fused.h"
#include "models/bert_init.h"

namespace fusekit::models {
namespace {

using kernels::DType;

BertConfig small_config(DType dtype, int batch, int sequence, float dropout) {
  BertConfig c = bert_preset("bert-tiny");
  c.batch = batch;
  c.sequence = sequence;
  c.dtype = dtype;
  c.dropout = dropout;
  validate(c);
  return c;
}

// Random weights, nonzero biases, every value representable in the dtype (models/bert_init.h).
std::unique_ptr<BertInitialWeights> random_state_dict(const BertConfig& config, DType dtype, uint64_t seed) {
  return std::make_unique<BertInitialWeights>(config, seed, dtype, 0.01f);
}

MlmDataOptions data_options(const BertConfig& c, uint64_t seed) {
  MlmDataOptions o;
  o.batch = c.batch;
  o.sequence = c.sequence;
  o.vocab = c.vocab;
  o.seed = seed;
  return o;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

const HostTensor& find(const std::vector<HostTensor>& tensors, const std::string& name) {
  for (const HostTensor& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no tensor " + name);
}

std::vector<TensorView> views_of(const std::vector<HostTensor>& tensors) {
  std::vector<TensorView> views;
  for (const HostTensor& t : tensors) {
    views.push_back({t.name, TensorType::f32, t.shape, std::as_bytes(std::span<const float>(t.values))});
  }
  return views;
}

// The fused run's dropout masks, regenerated on the host from its Philox streams
// (FusedBert::dropout_key per site; counter offset *offset, read at each call: the forward passes
// so far, the current one included), for the site kinds in `kinds` (FusedBert::dropout_site_kind);
// elsewhere 1 - p, which the baseline's 1 / (1 - p) turns into no dropout.
baselines::BaselineBert::DropoutMasks fused_masks(const BertConfig& config, const BertTrainOptions& options,
                                                  uint32_t kinds, const uint64_t* offset) {
  const uint32_t threshold = kernels::dropout_threshold(config.dropout);
  const float off = 1.f - config.dropout;
  return [=](int site, at::IntArrayRef sizes) {
    const bool on = kinds >> FusedBert::dropout_site_kind(site) & 1u;
    const uint64_t key = FusedBert::dropout_key(options.seed, site);
    std::vector<float> kept(static_cast<size_t>(c10::multiply_integers(sizes)), off);
    for (size_t group = 0; on && 8 * group < kept.size(); ++group) {
      const kernels::PhiloxWords words = kernels::dropout_words(key, *offset, group);
      for (size_t k = 0; k < 8 && 8 * group + k < kept.size(); ++k) {
        kept[8 * group + k] = kernels::dropout_draw(words, static_cast<int>(k)) >= threshold ? 1.f : 0.f;
      }
    }
    return torch::from_blob(kept.data(), sizes, torch::kFloat).clone().to(torch::kCUDA);
  };
}

// For a 10-step window whose fused loss left the baseline's: where one step's loss is out of line,
// replays the fused run up to it and tells a bad forward from bad parameters. The parameters before
// that step go to the fused step without dropout, the baseline in fp32 without dropout and under
// AMP; the step itself is repeated from the same state (the same masks: is it deterministic).
void diagnose_excursion(const BertConfig& config, const BertTrainOptions& options, const BertInitialWeights& state,
                        const MlmDataOptions& data, int step) {
  FusedBert fused(config, options);
  fused.load_state_dict(state.tensors());
  for (int s = 0; s < step; ++s) fused.step(make_mlm_batch(data, static_cast<uint64_t>(s)));
  const MlmBatch batch = make_mlm_batch(data, static_cast<uint64_t>(step));
  const float again = fused.forward_backward(batch);
  const std::vector<HostTensor> before = fused.parameters();
  const std::vector<TensorView> views = views_of(before);
  BertConfig still = config;
  still.dropout = 0.f;
  FusedBert fused_still(still, options);
  baselines::BaselineBert fp32_still(still, options, baselines::BaselinePrecision::fp32);
  baselines::BaselineBert amp_still(still, options, baselines::BaselinePrecision::amp);
  fused_still.load_state_dict(views);
  fp32_still.load_state_dict(views);
  amp_still.load_state_dict(views);
  std::printf(
      "  step %d replayed: fused %.4f with its masks again; without dropout, from the same parameters: fused %.4f, "
      "baseline fp32 %.4f, baseline AMP %.4f\n",
      step, again, fused_still.forward_backward(batch), fp32_still.forward_backward(batch),
      amp_still.forward_backward(batch));
  // The baseline in fp32 with the fused step's own masks (regenerated on the host from the same
  // Philox stream): a loss like the fused one says these masks do it to the model; a loss like the
  // others' says a fused kernel applies them wrongly.
  baselines::BaselineBert fp32_masked(config, options, baselines::BaselinePrecision::fp32);
  fp32_masked.load_state_dict(views);
  const uint64_t offset = static_cast<uint64_t>(step) + 1;  // forward passes so far, this one included
  fp32_masked.set_dropout_masks(fused_masks(config, options, ~0u, &offset));
  std::printf("  step %d: the baseline in fp32 with the fused step's masks: %.4f\n", step,
              fp32_masked.forward_backward(batch));
  // One kind of site at a time, the fused step and the fp32 baseline on the same masks: where a
  // fused kernel applies its mask wrongly, that kind's pair differs by far more than the others'.
  static const char* kKinds[] = {"embeddings", "attention probabilities", "attention output", "FFN output"};
  for (uint32_t kind = 0; kind < 4; ++kind) {
    FusedBert fused_kind(config, options);
    fused_kind.load_state_dict(views);
    fused_kind.set_dropout_site_kinds(1u << kind);
    fused_kind.set_dropout_step(offset - 1);  // its forward advances to `offset`
    fp32_masked.set_dropout_masks(fused_masks(config, options, 1u << kind, &offset));
    std::printf("  step %d, dropout at the %s only: fused %.4f, baseline fp32 %.4f\n", step, kKinds[kind],
                fused_kind.forward_backward(batch), fp32_masked.forward_backward(batch));
  }
  int masked = 0;
  for (int64_t label : batch.labels) masked += label >= 0;
  std::printf("  step %d's batch: %d masked tokens\n", step, masked);
}

class BertModelTest : public ::testing::TestWithParam<DType> {};

TEST_P(BertModelTest, GradientsWithinTwiceTheAmpBaselinesError) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  const BertConfig config = small_config(dtype, 8, 64, 0.f);
  const auto state = random_state_dict(config, dtype, 1);
  const MlmBatch batch = make_mlm_batch(data_options(config, 7), 0);
  BertTrainOptions options;

  baselines::BaselineBert reference(config, options, baselines::BaselinePrecision::fp32);
  baselines::BaselineBert amp(config, options, baselines::BaselinePrecision::amp);
  FusedBert fused(config, options);
  reference.load_state_dict(state->tensors());
  amp.load_state_dict(state->tensors());
  fused.load_state_dict(state->tensors());

  const float loss_reference = reference.forward_backward(batch);
  const float loss_amp = amp.forward_backward(batch);
  const float loss_fused = fused.forward_backward(batch);
  // Near ln(vocab) at initialization; the fused loss within twice the AMP loss's error (+ a floor).
  EXPECT_NEAR(loss_reference, std::log(static_cast<double>(config.vocab)), 0.5);
  EXPECT_LE(std::fabs(loss_fused - loss_reference), 2 * std::fabs(loss_amp - loss_reference) + 2e-3 * loss_reference)
      << "losses: fp32 " << loss_reference << ", amp " << loss_amp << ", fused " << loss_fused;

  const std::vector<HostTensor> g_reference = reference.gradients(), g_amp = amp.gradients(),
                                g_fused = fused.gradients();
  ASSERT_EQ(g_fused.size(), g_reference.size());
  // A floor for tensors the AMP run reproduces almost exactly: a relative error of the storage
  // type's unit roundoff (fp16 2^-11, bf16 2^-8), twice.
  const double floor = 2 * (dtype == DType::bf16 ? 0x1p-8 : 0x1p-11);
  int checked = 0;
  double largest = 0;
  for (const HostTensor& r : g_reference) largest = std::max(largest, norm(r.values));
  for (const HostTensor& r : g_reference) {
    const HostTensor& a = find(g_amp, r.name);
    const HostTensor& f = find(g_fused, r.name);
    ASSERT_EQ(f.shape, r.shape) << r.name;
    // The key bias's gradient is exactly zero (the softmax cancels q.b_k): rounding noise in every
    // run, which must stay small against the other gradients; no relative error is defined.
    if (r.name.find("attention.self.key.bias") != std::string::npos) {
      EXPECT_LE(norm(f.values), 1e-3 * largest) << r.name;
      ++checked;
      continue;
    }
    const double scale = norm(r.values);
    ASSERT_GT(scale, 0) << r.name << ": the fp32 gradient is zero";
    const double error_amp = distance(a.values, r.values) / scale;
    const double error_fused = distance(f.values, r.values) / scale;
    EXPECT_LE(error_fused, 2 * error_amp + floor)
        << r.name << ": fused relative error " << error_fused << ", AMP baseline's " << error_amp;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(g_reference.size()));
}

TEST_P(BertModelTest, LossCurvesTrackTheBaselineOver200Steps) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  const BertConfig config = small_config(dtype, 16, 64, 0.1f);
  const auto state = random_state_dict(config, dtype, 2);
  BertTrainOptions options;
  options.lr = 1e-3;
  constexpr int kSteps = 200, kWindow = 10;
  // Words drawn from 64 of the vocabulary's entries: a distribution the model can learn in 200
  // steps (uniform words over the whole vocabulary leave nothing to learn: the loss stays at
  // ln(29523)), so that the curves fall and the comparison says something.
  MlmDataOptions learnable = data_options(config, 11);
  learnable.first_word = config.vocab - 64;
  std::vector<std::vector<float>> losses;  // per variant, per step: printed for a window that fails
  uint64_t offset = 0;                     // the masked baseline's Philox offset: its forwards so far
  auto curve = [&](BertMlmModel& model) {
    model.load_state_dict(state->tensors());
    std::vector<double> windows(kSteps / kWindow, 0.0);
    losses.emplace_back();
    for (int s = 0; s < kSteps; ++s) {
      offset = static_cast<uint64_t>(s) + 1;
      const float loss = model.step(make_mlm_batch(learnable, static_cast<uint64_t>(s)));
      EXPECT_TRUE(std::isfinite(loss)) << model.variant() << " step " << s;
      windows[s / kWindow] += loss / kWindow;
      losses.back().push_back(loss);
    }
    return windows;
  };
  BertTrainOptions other_seed = options;
  other_seed.seed = 12345;
  // Each model is built right before its curve: a BaselineBert seeds torch's CUDA generator when it
  // is built, so building them all first would leave both baselines on the last one's seed.
  std::vector<double> b1, b2, f, bm;
  {
    baselines::BaselineBert baseline(config, options, baselines::BaselinePrecision::amp);
    b1 = curve(baseline);
  }
  {
    baselines::BaselineBert baseline2(config, other_seed, baselines::BaselinePrecision::amp);
    b2 = curve(baseline2);
  }
  {
    FusedBert fused(config, options);
    f = curve(fused);
  }
  {
    baselines::BaselineBert masked(config, options, baselines::BaselinePrecision::amp);
    masked.set_dropout_masks(fused_masks(config, options, ~0u, &offset));
    bm = curve(masked);
  }
  EXPECT_LT(b1.back(), b1.front() - 0.5) << "the baseline does not learn: the test says nothing";
  // Per window, the fused run against the baseline drawing the same masks (the same function, step
  // for step), within 2% or the spread of the two baselines that differ only in their dropout seed.
  // A mask draw can move one step's loss by a nat or more, in either model (the small model's
  // response to dropout is heavy-tailed): against a baseline with other masks, such a step is
  // dropout noise, not a kernel fault, so that comparison is made over the trained half below.
  for (size_t w = 0; w < f.size(); ++w) {
    const double allowed = std::max(0.02 * bm[w], std::fabs(b1[w] - b2[w]));
    EXPECT_LE(std::fabs(f[w] - bm[w]), allowed)
        << "steps " << w * kWindow << ".." << (w + 1) * kWindow - 1 << ": fused " << f[w]
        << ", baseline on the fused masks " << bm[w] << " (baseline " << b1[w] << ", other seed " << b2[w] << ")";
    std::printf("window %2zu: baseline %.4f (seed 2: %.4f, fused masks: %.4f), fused %.4f\n", w, b1[w], b2[w], bm[w],
                f[w]);
    if (std::fabs(f[w] - bm[w]) > allowed) {
      size_t worst = w * kWindow;
      for (size_t s = w * kWindow; s < (w + 1) * kWindow; ++s) {
        std::printf("  step %3zu: baseline %.4f (seed 2: %.4f, fused masks %.4f), fused %.4f\n", s, losses[0][s],
                    losses[1][s], losses[3][s], losses[2][s]);
        if (std::fabs(losses[2][s] - losses[3][s]) > std::fabs(losses[2][worst] - losses[3][worst])) worst = s;
      }
      diagnose_excursion(config, options, *state, learnable, static_cast<int>(worst));
    }
  }
  // The fused run with its own masks against the baseline with torch's, over steps 100..199: within
  // 2% or the two baselines' spread there.
  auto mean = [&](size_t variant) {
    double sum = 0;
    for (int s = kSteps / 2; s < kSteps; ++s) sum += losses[variant][s];
    return sum / (kSteps / 2);
  };
  const double m1 = mean(0), m2 = mean(1), mf = mean(2), mm = mean(3);
  std::printf("steps %d..%d: baseline %.4f (seed 2: %.4f, fused masks: %.4f), fused %.4f\n", kSteps / 2, kSteps - 1, m1,
              m2, mm, mf);
  EXPECT_LE(std::fabs(mf - m1), std::max(0.02 * m1, std::fabs(m1 - m2)))
      << "steps " << kSteps / 2 << ".." << kSteps - 1 << ": fused " << mf << ", baseline " << m1;
}

TEST_P(BertModelTest, DropoutMasksChangeEveryStepAndFollowTheSeed) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  const BertConfig config = small_config(dtype, 4, 32, 0.1f);
  const auto state = random_state_dict(config, dtype, 3);
  const MlmBatch batch = make_mlm_batch(data_options(config, 5), 0);
  BertTrainOptions options;
  FusedBert a(config, options), b(config, options);
  a.load_state_dict(state->tensors());
  b.load_state_dict(state->tensors());
  const float a1 = a.forward_backward(batch), a2 = a.forward_backward(batch);
  const float b1 = b.forward_backward(batch);
  EXPECT_EQ(a1, b1) << "the same seed, weights and batch: the same masks, the same loss";
  EXPECT_NE(a1, a2) << "a second step drew the same masks";
  BertTrainOptions other = options;
  other.seed = 99;
  FusedBert c(config, other);
  c.load_state_dict(state->tensors());
  EXPECT_NE(c.forward_backward(batch), a1) << "another seed drew the same masks";
  // Without dropout the loss is a function of the weights and the batch alone.
  const BertConfig plain = small_config(dtype, 4, 32, 0.f);
  FusedBert d(plain, options);
  d.load_state_dict(state->tensors());
  EXPECT_EQ(d.forward_backward(batch), d.forward_backward(batch));
}

// fp16 only: a loss scale of 1e30 overflows its gradients for sure; bf16 has float's range.
TEST(BertModelFp16, AStepWithOverflowingGradientsIsSkipped) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = DType::f16;
  const BertConfig config = small_config(dtype, 4, 32, 0.f);
  const auto state = random_state_dict(config, dtype, 4);
  const MlmBatch batch = make_mlm_batch(data_options(config, 3), 0);
  BertTrainOptions options;
  options.loss_scale = 1e30f;  // the scaled loss's gradients overflow fp16
  FusedBert fused(config, options);
  fused.load_state_dict(state->tensors());
  const std::vector<HostTensor> before = fused.parameters();
  fused.step(batch);
  const std::vector<HostTensor> after = fused.parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].values, after[i].values) << before[i].name;
  // And a normal step moves every weight matrix.
  BertTrainOptions normal;
  FusedBert trained(config, normal);
  trained.load_state_dict(state->tensors());
  trained.step(batch);
  const std::vector<HostTensor> moved = trained.parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    if (before[i].shape.size() == 2) EXPECT_NE(before[i].values, moved[i].values) << before[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BertModelTest, ::testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(kernels::dtype_name(info.param)); });

}  // namespace
}  // namespace fusekit::models
