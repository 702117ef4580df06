// models/bert_init.h: the random weights every variant starts from.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/bert_checkpoint.h"
#include "models/bert_init.h"
#include "models/bert_parameters.h"
#include "models/storage_conversion.h"

namespace fusekit::models {
namespace {

using kernels::DType;

std::vector<float> values(const TensorView& t) {
  std::vector<float> v(t.elements());
  convert_storage(DType::f32, t.bytes.data(), DType::f32, reinterpret_cast<std::byte*>(v.data()), v.size());
  return v;
}

const TensorView& find(const BertInitialWeights& w, const std::string& name) {
  for (const TensorView& t : w.tensors()) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("missing " + name);
}

TEST(BertInitialWeights, DeterministicInTheSeedAndBertsScale) {
  const BertConfig config = bert_preset("bert-tiny");
  const BertInitialWeights a(config, 5, DType::f16), b(config, 5, DType::f16), c(config, 6, DType::f16);
  const std::string word = "bert.embeddings.word_embeddings.weight";
  EXPECT_EQ(values(find(a, word)), values(find(b, word)));
  EXPECT_NE(values(find(a, word)), values(find(c, word)));
  const std::vector<float> w = values(find(a, word));
  double sum = 0, squares = 0;
  for (float x : w) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double mean = sum / w.size(), std = std::sqrt(squares / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std, 0.02, 1e-3);
  for (float x : values(find(a, "bert.embeddings.LayerNorm.weight"))) EXPECT_EQ(x, 1.f);
  for (float x : values(find(a, "bert.embeddings.LayerNorm.bias"))) EXPECT_EQ(x, 0.f);
  for (float x : values(find(a, "bert.encoder.layer.0.attention.self.query.bias"))) EXPECT_EQ(x, 0.f);
}

TEST(BertInitialWeights, EveryValueIsRepresentableInTheStorageType) {
  const BertConfig config = bert_preset("bert-tiny");
  for (DType dtype : {DType::f16, DType::bf16}) {
    const BertInitialWeights w(config, 1, dtype, 0.01f);
    bool nonzero_bias = false;
    for (const TensorView& t : w.tensors()) {
      const std::vector<float> v = values(t);
      std::vector<std::byte> narrow(v.size() * 2), wide(v.size() * 4);
      convert_storage(DType::f32, reinterpret_cast<const std::byte*>(v.data()), dtype, narrow.data(), v.size());
      convert_storage(dtype, narrow.data(), DType::f32, wide.data(), v.size());
      ASSERT_EQ(0, std::memcmp(wide.data(), v.data(), wide.size())) << t.name << " in " << dtype_spec_name(dtype);
      if (t.name == "bert.encoder.layer.1.output.dense.bias") {
        for (float x : v) nonzero_bias = nonzero_bias || x != 0.f;
      }
    }
    EXPECT_TRUE(nonzero_bias) << "bias_std > 0 draws the biases";
  }
}

TEST(BertInitialWeights, LoadIntoEitherLayout) {
  const BertConfig config = bert_preset("bert-tiny");
  const BertInitialWeights w(config, 2, DType::bf16, 0.01f);
  for (QkvLayout qkv : {QkvLayout::separate, QkvLayout::packed}) {
    const BertParameterLayout layout(config, qkv, DType::bf16);
    std::vector<std::byte> flat(layout.flat_bytes());
    const CheckpointLoadReport report = load_bert_state_dict(w.tensors(), layout, flat);
    const std::set<std::string> loaded(report.loaded.begin(), report.loaded.end());
    for (const TensorView& t : w.tensors()) EXPECT_TRUE(loaded.count(t.name)) << t.name;  // missing ones throw
    EXPECT_TRUE(report.ignored.empty());
  }
}

}  // namespace
}  // namespace fusekit::models
