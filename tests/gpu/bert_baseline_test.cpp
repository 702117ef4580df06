// The libtorch BERT masked-LM step (baselines/models/bert_baseline.h) on bert-tiny, batch 4, sequence
// 32, no dropout, from random weights written as a Hugging Face state dict (normal(0, 0.02), LayerNorm
// 1 and 0) and batches of models/mlm_data.h:
// - fp32 against Hugging Face's BertForMaskedLM in fp32 (scripts/peers/bert_reference.py, eager
//   attention): the loss within 1e-5 and every gradient within 1e-4 relative. DESIGN's fp32 bound for
//   one operator is 1e-5; a gradient here passes through some twenty of them, and the two sides sum
//   in different orders (SDPA's kernel against eager's matmul and softmax). Skipped, saying why, where
//   python3 cannot import torch, transformers and safetensors.
// - amp (fp16, bf16) against fp32 from the same weights: every gradient within 2% (fp16) or 5% (bf16)
//   relative, a few times DESIGN's per-operator bound of the type (2e-3, 1e-2), since every gradient
//   goes through several roundings to it; the loss finite and near ln(vocab), as at initialization.
// - 20 steps on one batch lower the loss; a step whose scaled gradients overflow changes nothing.
// - load_state_dict then parameters() gives the weights back exactly; steps enqueued on a stream give
//   step's losses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "baselines/models/bert_baseline.h"
#include "gpu_test_support.h"
#include "models/bert_checkpoint.h"
#include "models/bert_parameters.h"
#include "models/mlm_data.h"
#include "models/safetensors.h"
#include "posix_files.h"
#include "test_stream.h"

namespace fusekit {
namespace {

using baselines::BaselineBert;
using baselines::BaselinePrecision;

models::BertConfig tiny_config(kernels::DType dtype) {
  models::BertConfig config = models::bert_preset("bert-tiny");
  config.batch = 4;
  config.sequence = 32;
  config.dropout = 0.f;
  config.dtype = dtype;
  return config;
}

models::MlmDataOptions data_options(const models::BertConfig& config) {
  models::MlmDataOptions options;
  options.batch = config.batch;
  options.sequence = config.sequence;
  options.vocab = config.vocab;
  options.seed = 7;
  return options;
}

// A Hugging Face state dict of random weights, in the separate-QKV fp32 layout: normal(0, 0.02) for
// every tensor but the LayerNorms' (weight 1, bias 0). The biases are random too, so that a bias the
// forward left out changes the loss, not only its own gradient.
struct RandomWeights {
  explicit RandomWeights(const models::BertConfig& config, uint64_t seed = 1)
      : layout(config, models::QkvLayout::separate, kernels::DType::f32), flat(layout.flat_elements(), 0.f) {
    std::mt19937_64 random(seed);
    std::normal_distribution<float> normal(0.f, 0.02f);
    for (const models::BertParameter& p : layout.parameters()) {
      const bool layer_norm = p.name.find("LayerNorm.") != std::string::npos;
      const float constant = p.name.ends_with(".weight") ? 1.f : 0.f;
      for (size_t i = 0; i < p.elements; ++i) flat[p.offset + i] = layer_norm ? constant : normal(random);
    }
  }

  std::span<const std::byte> bytes() const { return std::as_bytes(std::span(flat)); }
  std::vector<models::TensorView> views() { return models::bert_state_dict_views(layout, bytes(), scratch); }
  std::vector<float> values(const models::BertParameter& p) const {
    return {flat.begin() + p.offset, flat.begin() + p.offset + p.elements};
  }

  models::BertParameterLayout layout;
  std::vector<float> flat;
  std::vector<std::byte> scratch;
};

// ‖out − ref‖ / ‖ref‖ in double; a non-finite value never passes.
double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return count;
}

std::vector<float> floats(const models::TensorView& t) {
  EXPECT_EQ(t.type, models::TensorType::f32) << t.name;
  std::vector<float> values(t.elements());
  if (t.type == models::TensorType::f32) std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

using test_support::run_command;

// A temporary folder without std::filesystem (tests/support/posix_files.h says why).
class TempDir : public test_support::TempDir {
 public:
  TempDir() : test_support::TempDir("fusekit_bert_baseline_") {}
};

TEST(BertBaselineTest, RejectsAnFp32Config) {
  models::BertConfig config = tiny_config(kernels::DType::f32);
  EXPECT_THROW(BaselineBert model(config, {}, BaselinePrecision::fp32), std::invalid_argument);
}

TEST(BertBaselineTest, Fp32MatchesHuggingFace) {
  FUSEKIT_REQUIRE_GPU();
  const auto [python_status, python_output] = run_command("python3 -c 'import torch, transformers, safetensors'");
  if (python_status != 0) {
    GTEST_SKIP() << "no Hugging Face reference: python3 cannot import torch, transformers and safetensors: "
                 << python_output;
  }
  const models::BertConfig config = tiny_config(kernels::DType::f16);
  RandomWeights weights(config);
  const models::MlmDataOptions data = data_options(config);
  const TempDir dir;
  models::save_bert_safetensors(dir.file("weights.safetensors"), weights.layout, weights.bytes());
  models::write_mlm_batches(dir.file("batches.safetensors"), data, 0, 1);
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.17g", config.layer_norm_eps);
  const std::string command =
      std::string("python3 '") + BERT_REFERENCE_SCRIPT + "' --weights '" + dir.file("weights.safetensors") +
      "' --batches '" + dir.file("batches.safetensors") + "' --batch-index 0 --layers " +
      std::to_string(config.layers) + " --hidden " + std::to_string(config.hidden) + " --heads " +
      std::to_string(config.heads) + " --intermediate " + std::to_string(config.intermediate) + " --vocab " +
      std::to_string(config.vocab) + " --max-positions " + std::to_string(config.max_positions) + " --token-types " +
      std::to_string(config.token_types) + " --layer-norm-eps " + eps + " --output '" +
      dir.file("reference.safetensors") + "'";
  const auto [status, output] = run_command(command);
  ASSERT_EQ(status, 0) << command << "\n" << output;
  const models::SafetensorsFile reference = models::SafetensorsFile::read(dir.file("reference.safetensors"));

  BaselineBert model(config, {}, BaselinePrecision::fp32);
  model.load_state_dict(weights.views());
  const float loss = model.forward_backward(models::make_mlm_batch(data, 0));
  const models::TensorView* reference_loss = reference.find("loss");
  ASSERT_NE(reference_loss, nullptr);
  ASSERT_EQ(reference_loss->elements(), 1u);
  EXPECT_NEAR(loss, floats(*reference_loss)[0], 1e-5);

  const std::vector<models::HostTensor> gradients = model.gradients();
  EXPECT_EQ(reference.tensors().size(), gradients.size() + 1) << "the reference's gradients and the loss";
  // The key projection's bias has a gradient of exactly zero (it adds q.b_k to every score of a
  // row, which the softmax cancels): both sides hold rounding noise there. So each tensor's error is
  // relative to its own norm or to 1e-4 of the largest gradient norm, whichever is larger.
  double largest = 0;
  for (const models::HostTensor& g : gradients) {
    double n = 0;
    for (float v : g.values) n += static_cast<double>(v) * v;
    largest = std::max(largest, std::sqrt(n));
  }
  for (const models::HostTensor& g : gradients) {
    const models::TensorView* r = reference.find(g.name);
    ASSERT_NE(r, nullptr) << g.name << ": no gradient in the reference";
    EXPECT_EQ(r->shape, g.shape) << g.name;
    const std::vector<float> ref = floats(*r);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size() && i < g.values.size(); ++i) {
      diff += (static_cast<double>(g.values[i]) - ref[i]) * (static_cast<double>(g.values[i]) - ref[i]);
      norm += static_cast<double>(ref[i]) * ref[i];
    }
    EXPECT_LE(std::sqrt(diff) / std::max(std::sqrt(norm), 1e-4 * largest), 1e-4) << g.name;
    if (g.name.find("attention.self.key.bias") == std::string::npos) {
      EXPECT_LE(relative_error(g.values, ref), 1e-4) << g.name;
    }
  }
}

class BertBaselineAmpTest : public ::testing::TestWithParam<kernels::DType> {};

TEST_P(BertBaselineAmpTest, GradientsCloseToFp32) {
  FUSEKIT_REQUIRE_GPU();
  const models::BertConfig config = tiny_config(GetParam());
  RandomWeights weights(config);
  const models::MlmBatch batch = models::make_mlm_batch(data_options(config), 0);
  BaselineBert fp32(config, {}, BaselinePrecision::fp32);
  BaselineBert amp(config, {}, BaselinePrecision::amp);
  fp32.load_state_dict(weights.views());
  amp.load_state_dict(weights.views());
  const float fp32_loss = fp32.forward_backward(batch);
  const float amp_loss = amp.forward_backward(batch);
  ASSERT_TRUE(std::isfinite(amp_loss));
  EXPECT_NEAR(amp_loss, std::log(static_cast<double>(config.vocab)), 0.5);
  EXPECT_NEAR(amp_loss, fp32_loss, 1e-2 * fp32_loss);

  const double bound = GetParam() == kernels::DType::f16 ? 2e-2 : 5e-2;
  const std::vector<models::HostTensor> reference = fp32.gradients();
  const std::vector<models::HostTensor> gradients = amp.gradients();
  ASSERT_EQ(gradients.size(), reference.size());
  double worst = 0, largest = 0;
  std::string worst_name;
  auto norm = [](const std::vector<float>& v) {
    double n = 0;
    for (float x : v) n += static_cast<double>(x) * x;
    return std::sqrt(n);
  };
  for (const models::HostTensor& r : reference) largest = std::max(largest, norm(r.values));
  for (size_t i = 0; i < gradients.size(); ++i) {
    // The key bias's gradient is exactly zero (the softmax cancels q.b_k): both runs hold rounding
    // noise, which must stay small against the other gradients; no relative error is defined.
    if (gradients[i].name.find("attention.self.key.bias") != std::string::npos) {
      EXPECT_LE(norm(gradients[i].values), 1e-3 * largest) << gradients[i].name;
      continue;
    }
    const double error = relative_error(gradients[i].values, reference[i].values);
    EXPECT_LE(error, bound) << gradients[i].name;
    if (error >= worst) {
      worst = error;
      worst_name = gradients[i].name;
    }
  }
  std::printf("%s: loss %.6f (fp32 %.6f), largest gradient error %.3g (%s)\n", models::dtype_spec_name(GetParam()),
              amp_loss, fp32_loss, worst, worst_name.c_str());
}

TEST_P(BertBaselineAmpTest, TwentyStepsOnOneBatchLowerTheLoss) {
  FUSEKIT_REQUIRE_GPU();
  const models::BertConfig config = tiny_config(GetParam());
  RandomWeights weights(config);
  const models::MlmBatch batch = models::make_mlm_batch(data_options(config), 0);
  models::BertTrainOptions options;
  options.lr = 1e-3;  // BERT's 1e-4 moves a model this small little in 20 steps
  BaselineBert model(config, options);
  model.load_state_dict(weights.views());
  std::vector<float> losses;
  for (int i = 0; i < 20; ++i) losses.push_back(model.step(batch));
  for (float loss : losses) ASSERT_TRUE(std::isfinite(loss));
  EXPECT_LT(losses.back(), losses.front() - 1.f) << "first " << losses.front() << ", last " << losses.back();
}

INSTANTIATE_TEST_SUITE_P(Types, BertBaselineAmpTest, ::testing::Values(kernels::DType::f16, kernels::DType::bf16),
                         [](const auto& info) { return std::string(models::dtype_spec_name(info.param)); });

TEST(BertBaselineTest, OverflowingStepLeavesTheParameters) {
  FUSEKIT_REQUIRE_GPU();
  const models::BertConfig config = tiny_config(kernels::DType::f16);
  RandomWeights weights(config);
  models::BertTrainOptions options;
  options.loss_scale = 1e30f;  // the logits' gradient, scaled, overflows fp16
  BaselineBert model(config, options);
  model.load_state_dict(weights.views());
  const std::vector<models::HostTensor> before = model.parameters();
  EXPECT_TRUE(std::isfinite(model.step(models::make_mlm_batch(data_options(config), 0))));
  size_t non_finite = 0;
  for (const models::HostTensor& g : model.gradients()) {
    for (float v : g.values) non_finite += !std::isfinite(v);
  }
  EXPECT_GT(non_finite, 0u) << "the scaled gradients did not overflow: the case tests nothing";
  const std::vector<models::HostTensor> after = model.parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(differing(after[i].values, before[i].values), 0u) << after[i].name;
}

TEST(BertBaselineTest, LoadThenParametersGivesTheWeightsBack) {
  FUSEKIT_REQUIRE_GPU();
  const models::BertConfig config = tiny_config(kernels::DType::bf16);
  RandomWeights weights(config);
  BaselineBert model(config, {});
  model.load_state_dict(weights.views());
  const std::vector<models::HostTensor> parameters = model.parameters();
  const std::vector<models::BertParameter>& expected = weights.layout.parameters();
  ASSERT_EQ(parameters.size(), expected.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_EQ(parameters[i].name, expected[i].name);
    EXPECT_EQ(parameters[i].shape, expected[i].shape) << expected[i].name;
    EXPECT_EQ(differing(parameters[i].values, weights.values(expected[i])), 0u) << expected[i].name;
  }
}

TEST(BertBaselineTest, StepsEnqueuedOnAStreamMatchStep) {
  FUSEKIT_REQUIRE_GPU();
  const models::BertConfig config = tiny_config(kernels::DType::f16);
  RandomWeights weights(config);
  const std::vector<models::MlmBatch> batches = {models::make_mlm_batch(data_options(config), 0),
                                                 models::make_mlm_batch(data_options(config), 1)};
  models::BertTrainOptions options;
  options.lr = 1e-3;
  const test_support::NonBlockingStream stream;
  BaselineBert stepped(config, options);
  BaselineBert enqueued(config, options);
  stepped.load_state_dict(weights.views());
  enqueued.load_state_dict(weights.views());
  enqueued.prepare_batches(batches);
  for (int i = 0; i < 4; ++i) {
    const float expected = stepped.step(batches[i % 2]);
    enqueued.enqueue_step(i % 2, stream.stream);
    EXPECT_NEAR(enqueued.last_loss(), expected, 1e-3 * expected) << "step " << i;
  }
  EXPECT_THROW(enqueued.enqueue_step(2, stream.stream), std::out_of_range);
}

TEST(BertBaselineTest, RejectsABatchOfAnotherShape) {
  FUSEKIT_REQUIRE_GPU();
  const models::BertConfig config = tiny_config(kernels::DType::f16);
  BaselineBert model(config, {});
  models::MlmDataOptions other = data_options(config);
  other.sequence = 16;
  EXPECT_THROW(model.forward_backward(models::make_mlm_batch(other, 0)), std::invalid_argument);
  EXPECT_THROW(model.gradients(), std::logic_error);
  EXPECT_THROW(model.last_loss(), std::logic_error);
}

}  // namespace
}  // namespace fusekit
