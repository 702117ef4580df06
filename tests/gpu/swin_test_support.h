// What the Swin step tests share (swin_model_test.cpp, swin_baseline_test.cpp): random batches,
// float views of safetensors, norms, and timm's reference step (scripts/peers/swin_reference.py,
// path in SWIN_REFERENCE_SCRIPT): the loss and every gradient of timm's SwinTransformer from the
// same weights and batch, in float32 ("fp32.*") and under AMP ("amp.*").
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/safetensors.h"
#include "models/swin_config.h"
#include "models/swin_fused.h"  // SwinBatch, HostTensor
#include "posix_files.h"

namespace fusekit::models::swin_test {

inline std::vector<float> floats(const TensorView& t) {
  std::vector<float> values(t.elements());
  EXPECT_EQ(t.type, TensorType::f32) << t.name;
  if (t.type == TensorType::f32) std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

// A float32 tensor of `file` by name; a test failure and nothing where it is missing.
inline std::vector<float> floats_of(const SafetensorsFile& file, const std::string& name) {
  const TensorView* t = file.find(name);
  if (t == nullptr) {
    ADD_FAILURE() << "the reference has no tensor " << name;
    return {};
  }
  return floats(*t);
}

inline double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

inline double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

inline SwinBatch random_batch(const SwinConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> label(0, c.classes - 1);
  SwinBatch b;
  b.images.resize(static_cast<size_t>(c.batch) * c.in_channels * c.image_size * c.image_size);
  for (float& v : b.images) v = normal(rng);
  for (int i = 0; i < c.batch; ++i) b.labels.push_back(label(rng));
  return b;
}

// Runs timm's reference step in `dir` and returns the command and its output where it failed
// (status != 0); the tensors are then in dir.file("reference.safetensors").
inline std::pair<int, std::string> run_timm_reference(const SwinConfig& config, const std::vector<TensorView>& weights,
                                                      const SwinBatch& batch, const test_support::TempDir& dir) {
  write_safetensors(dir.file("weights.safetensors"), weights);
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
                              dtype_spec_name(config.dtype) + " --output '" + dir.file("reference.safetensors") + "'";
  auto [status, output] = test_support::run_command(command);
  return {status, command + "\n" + output};
}

// Whether `gradients` lie within twice AMP's own error of the float32 ones: per tensor,
// |g - fp32| / max(|fp32|, noise) <= max(2 |amp - fp32| / max(|fp32|, noise), floor), noise = 1e-3
// of the mean float32 gradient norm (gradients that are rounding noise), floor DESIGN.md's bound
// for the dtype. `fp32_of` and `amp_of` give the reference tensors by name.
template <class Fp32Of, class AmpOf>
void expect_within_amp_error(const std::vector<HostTensor>& gradients, Fp32Of fp32_of, AmpOf amp_of, double floor,
                             const char* what) {
  double mean_norm = 0;
  for (const HostTensor& g : gradients) mean_norm += norm(fp32_of(g.name)) / static_cast<double>(gradients.size());
  const double noise = 1e-3 * mean_norm;
  for (const HostTensor& g : gradients) {
    const std::vector<float> fp32 = fp32_of(g.name), amp = amp_of(g.name);
    ASSERT_EQ(fp32.size(), g.values.size()) << what << " " << g.name;
    const double scale = std::max(norm(fp32), noise);
    const double bound = std::max(2.0 * distance(amp, fp32) / scale, floor);
    EXPECT_LE(distance(g.values, fp32) / scale, bound) << what << " " << g.name;
  }
}

}  // namespace fusekit::models::swin_test
