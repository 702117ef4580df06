// The fused Swin step (models/swin_fused.h) against timm's SwinTransformer: one forward and backward
// of the small config (swin-test: image 56, two stages of two blocks, C 32, heads 1 and 2, 10 classes;
// stage 0 shifts its odd block, stage 1 is one window) at batch 4, in fp16 and bf16, from the same
// weights (models/swin_init.h) and images. scripts/peers/swin_reference.py gives timm's loss and
// gradients in float32 and under AMP; the fused step's loss and every gradient must lie within twice
// AMP's own error against float32 (a floor for gradients that are rounding noise: 1e-3 of the mean
// gradient norm). Then 5 training steps lower the loss, and the step allocates nothing after the first.
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

namespace fusekit::models {
namespace {

using test_support::run_command;

std::vector<float> floats(const TensorView& t) {
  std::vector<float> values(t.elements());
  EXPECT_EQ(t.type, TensorType::f32) << t.name;
  if (t.type == TensorType::f32) std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

SwinBatch random_batch(const SwinConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> label(0, c.classes - 1);
  SwinBatch b;
  b.images.resize(static_cast<size_t>(c.batch) * c.in_channels * c.image_size * c.image_size);
  for (float& v : b.images) v = normal(rng);
  for (int i = 0; i < c.batch; ++i) b.labels.push_back(label(rng));
  return b;
}

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
  write_safetensors(dir.file("weights.safetensors"), weights.tensors());
  const std::vector<int64_t> image_shape = {config.batch, config.in_channels, config.image_size, config.image_size};
  write_safetensors(dir.file("batch.safetensors"),
                    {{"images", TensorType::f32, image_shape,
                      std::as_bytes(std::span<const float>(batch.images.data(), batch.images.size()))},
                     {"labels",
                      TensorType::i64,
                      {config.batch},
                      std::as_bytes(std::span<const int64_t>(batch.labels.data(), batch.labels.size()))}});
  std::string depths, heads;
  for (int s = 0; s < config.stages(); ++s) {
    depths += (s ? "," : "") + std::to_string(config.depths[s]);
    heads += (s ? "," : "") + std::to_string(config.heads[s]);
  }
  const std::string command = std::string("python3 '") + SWIN_REFERENCE_SCRIPT + "' --weights '" +
                              dir.file("weights.safetensors") + "' --batch '" + dir.file("batch.safetensors") +
                              "' --image " + std::to_string(config.image_size) + " --patch " +
                              std::to_string(config.patch) + " --window " + std::to_string(config.window) +
                              " --embed-dim " + std::to_string(config.embed_dim) + " --depths " + depths + " --heads " +
                              heads + " --classes " + std::to_string(config.classes) + " --dtype " +
                              dtype_spec_name(dtype) + " --output '" + dir.file("reference.safetensors") + "'";
  const auto [status, output] = run_command(command);
  ASSERT_EQ(status, 0) << command << "\n" << output;
  const SafetensorsFile reference = SafetensorsFile::read(dir.file("reference.safetensors"));

  FusedSwin model(config);
  model.load_state_dict(weights.tensors());
  const float loss = model.forward_backward(batch);
  const float fp32_loss = floats(*reference.find("fp32.loss"))[0], amp_loss = floats(*reference.find("amp.loss"))[0];
  const double floor = dtype == kernels::DType::f16 ? 2e-3 : 1e-2;  // DESIGN.md's bounds
  EXPECT_LE(std::fabs(loss - fp32_loss), std::max(2.0 * std::fabs(amp_loss - fp32_loss), floor * fp32_loss))
      << "fused " << loss << ", timm float32 " << fp32_loss << ", timm AMP " << amp_loss;

  const std::vector<HostTensor> gradients = model.gradients();
  double mean_norm = 0;
  for (const HostTensor& g : gradients) {
    const TensorView* r = reference.find("fp32." + g.name);
    ASSERT_NE(r, nullptr) << g.name;
    mean_norm += norm(floats(*r)) / static_cast<double>(gradients.size());
  }
  const double noise = 1e-3 * mean_norm;
  for (const HostTensor& g : gradients) {
    const std::vector<float> fp32 = floats(*reference.find("fp32." + g.name));
    const std::vector<float> amp = floats(*reference.find("amp." + g.name));
    ASSERT_EQ(fp32.size(), g.values.size()) << g.name;
    const double scale = std::max(norm(fp32), noise);
    const double bound = std::max(2.0 * distance(amp, fp32) / scale, floor);
    EXPECT_LE(distance(g.values, fp32) / scale, bound) << g.name;
  }
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
