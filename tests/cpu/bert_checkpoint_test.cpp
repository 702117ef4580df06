// Loading a Hugging Face BERT state dict into the flat layout: a tiny synthetic checkpoint written
// by the safetensors writer, with the packed QKV rows, dtype conversion, the tied decoder, the older
// LayerNorm names, ignored and missing tensors; and saving the flat buffer back.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "models/bert_checkpoint.h"
#include "models/storage_conversion.h"

namespace fusekit::models {
namespace {

// A tiny BERT (2 layers, hidden 128) with a small vocabulary, so the checkpoint stays small.
BertConfig tiny_config() {
  BertConfig c = bert_preset("bert-tiny");
  c.vocab = 100;
  c.max_positions = 16;
  c.sequence = 16;
  return c;
}

// A Hugging Face state dict in fp32: every tensor's values start from minus its index and step by
// 1/4 (fp16 holds them exactly; bf16 rounds some, which the checks account for).
struct Checkpoint {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> order;

  void add(const std::string& name, std::vector<int64_t> shape, float base) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 512) * 0.25f;
    values[name] = std::move(v);
    shapes[name] = std::move(shape);
    order.push_back(name);
  }
  void erase(const std::string& name) {
    values.erase(name);
    shapes.erase(name);
    std::erase(order, name);
  }
  std::vector<TensorView> views() const {
    std::vector<TensorView> out;
    for (const std::string& name : order) {
      const std::vector<float>& v = values.at(name);
      out.push_back({name, TensorType::f32, shapes.at(name),
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()), v.size() * 4)});
    }
    return out;
  }
};

Checkpoint hugging_face_checkpoint(const BertConfig& c) {
  const BertParameterLayout separate(c, QkvLayout::separate, kernels::DType::f32);
  Checkpoint checkpoint;
  float base = 0;
  for (const BertParameter& p : separate.parameters()) checkpoint.add(p.name, p.shape, base++ * -1.0f);
  // What BertForPreTraining's state dict holds beyond the MLM model, and the tied decoder.
  checkpoint.add("bert.pooler.dense.weight", {c.hidden, c.hidden}, 7);
  checkpoint.add("bert.pooler.dense.bias", {c.hidden}, 7);
  checkpoint.add("cls.seq_relationship.weight", {2, c.hidden}, 7);
  checkpoint.add("bert.embeddings.position_ids", {1, c.max_positions}, 0);
  checkpoint.values["cls.predictions.decoder.weight"] = checkpoint.values["bert.embeddings.word_embeddings.weight"];
  checkpoint.shapes["cls.predictions.decoder.weight"] = {c.vocab, c.hidden};
  checkpoint.order.push_back("cls.predictions.decoder.weight");
  return checkpoint;
}

float flat_value(const BertParameterLayout& layout, const std::vector<std::byte>& flat, size_t element) {
  uint16_t bits;
  std::memcpy(&bits, flat.data() + element * 2, 2);
  return layout.storage() == kernels::DType::f16 ? half_to_float(bits) : bfloat16_to_float(bits);
}

// x as the layout's storage type holds it.
float stored(const BertParameterLayout& layout, float x) {
  return layout.storage() == kernels::DType::f16 ? half_to_float(float_to_half(x))
                                                 : bfloat16_to_float(float_to_bfloat16(x));
}

std::string load_error(const Checkpoint& checkpoint, const BertParameterLayout& layout) {
  std::vector<std::byte> flat(layout.flat_bytes());
  try {
    load_bert_state_dict(checkpoint.views(), layout, flat);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(BertCheckpoint, LoadsIntoThePackedLayout) {
  const BertConfig c = tiny_config();
  const Checkpoint checkpoint = hugging_face_checkpoint(c);
  for (kernels::DType storage : {kernels::DType::f16, kernels::DType::bf16}) {
    const BertParameterLayout layout(c, QkvLayout::packed, storage);
    std::vector<std::byte> flat(layout.flat_bytes(), std::byte{0x5A});  // the padding must come out zero
    const CheckpointLoadReport report = load_bert_state_dict(checkpoint.views(), layout, flat);
    EXPECT_EQ(report.loaded.size(), 5u + 2 * 16 + 5);
    EXPECT_EQ(report.ignored.size(), 4u);
    EXPECT_NE(report.ignored[0].find("bert.pooler.dense.weight (pooler"), std::string::npos);
    EXPECT_FALSE(report.notes.empty());  // the tied decoder was checked
    // Every Hugging Face tensor where the layout puts it; query, key, value in their thirds.
    for (const BertParameter& p : layout.parameters()) {
      const size_t packed = p.name.find("attention.self.qkv.");
      if (packed == std::string::npos) {
        const std::vector<float>& v = checkpoint.values.at(p.name);
        for (size_t i = 0; i < p.elements; i += 97)
          ASSERT_EQ(flat_value(layout, flat, p.offset + i), stored(layout, v[i])) << p.name;
        continue;
      }
      const bool bias = p.name.ends_with(".bias");
      const std::string prefix = p.name.substr(0, packed) + "attention.self.";
      const char* which[3] = {"query", "key", "value"};
      for (int w = 0; w < 3; ++w) {
        const std::vector<float>& v = checkpoint.values.at(prefix + which[w] + (bias ? ".bias" : ".weight"));
        const QkvRows rows = layout.qkv_rows(p.name.find("layer.1.") != std::string::npos ? 1 : 0, w, bias);
        const size_t row_elements = bias ? 1 : c.hidden;
        for (size_t i = 0; i < v.size(); i += 31) {
          ASSERT_EQ(flat_value(layout, flat, p.offset + rows.first_row * row_elements + i), stored(layout, v[i]))
              << p.name << " " << w;
        }
      }
    }
    // The padding after the decoder bias (100 elements, padded to 104) is zero.
    const BertParameter& last = layout.parameters().back();
    for (size_t i = last.offset + last.elements; i < layout.flat_elements(); ++i) {
      EXPECT_EQ(flat_value(layout, flat, i), 0.f);
    }
  }
}

TEST(BertCheckpoint, SavesAndLoadsBack) {
  const BertConfig c = tiny_config();
  const BertParameterLayout packed(c, QkvLayout::packed, kernels::DType::f16);
  std::vector<std::byte> flat(packed.flat_bytes());
  load_bert_state_dict(hugging_face_checkpoint(c).views(), packed, flat);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("fusekit_bert_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  save_bert_safetensors(path, packed, flat);
  // Into the other layout and back: the same bytes.
  const BertParameterLayout separate(c, QkvLayout::separate, kernels::DType::f16);
  std::vector<std::byte> separate_flat(separate.flat_bytes());
  const CheckpointLoadReport report = load_bert_safetensors(path, separate, separate_flat);
  EXPECT_TRUE(report.ignored.empty());
  std::vector<std::byte> scratch;
  const std::vector<TensorView> views = bert_state_dict_views(separate, separate_flat, scratch);
  std::vector<std::byte> again(packed.flat_bytes());
  load_bert_state_dict(views, packed, again);
  EXPECT_EQ(again, flat);
  const SafetensorsFile file = SafetensorsFile::read(path);
  EXPECT_EQ(file.find("cls.predictions.decoder.weight"), nullptr);
  EXPECT_EQ(file.find("bert.encoder.layer.1.attention.self.key.weight")->type, TensorType::f16);
  std::filesystem::remove(path);
}

TEST(BertCheckpoint, NamesAndAliases) {
  const BertConfig c = tiny_config();
  const BertParameterLayout layout(c, QkvLayout::packed, kernels::DType::f16);
  // The older LayerNorm names.
  Checkpoint old = hugging_face_checkpoint(c);
  for (const std::string name : {"bert.embeddings.LayerNorm", "bert.encoder.layer.1.output.LayerNorm"}) {
    old.values[name + ".gamma"] = old.values[name + ".weight"];
    old.shapes[name + ".gamma"] = old.shapes[name + ".weight"];
    old.order.push_back(name + ".gamma");
    old.values[name + ".beta"] = old.values[name + ".bias"];
    old.shapes[name + ".beta"] = old.shapes[name + ".bias"];
    old.order.push_back(name + ".beta");
    old.erase(name + ".weight");
    old.erase(name + ".bias");
  }
  EXPECT_EQ(load_error(old, layout), "");
  // The decoder bias stands in for cls.predictions.bias.
  Checkpoint decoder_bias = hugging_face_checkpoint(c);
  decoder_bias.values["cls.predictions.decoder.bias"] = decoder_bias.values["cls.predictions.bias"];
  decoder_bias.shapes["cls.predictions.decoder.bias"] = {c.vocab};
  decoder_bias.order.push_back("cls.predictions.decoder.bias");
  EXPECT_EQ(load_error(decoder_bias, layout), "");
  decoder_bias.values["cls.predictions.decoder.bias"][3] += 1;
  EXPECT_NE(load_error(decoder_bias, layout).find("differs from cls.predictions.bias"), std::string::npos);
  decoder_bias.erase("cls.predictions.bias");
  EXPECT_EQ(load_error(decoder_bias, layout), "");
}

TEST(BertCheckpoint, ErrorsNameTheTensors) {
  const BertConfig c = tiny_config();
  const BertParameterLayout layout(c, QkvLayout::packed, kernels::DType::f16);
  Checkpoint missing = hugging_face_checkpoint(c);
  missing.erase("bert.encoder.layer.1.attention.self.key.bias");
  missing.erase("cls.predictions.transform.dense.weight");
  const std::string error = load_error(missing, layout);
  EXPECT_NE(error.find("missing tensors: "), std::string::npos) << error;
  EXPECT_NE(error.find("bert.encoder.layer.1.attention.self.key.bias"), std::string::npos) << error;
  EXPECT_NE(error.find("cls.predictions.transform.dense.weight"), std::string::npos) << error;

  Checkpoint wrong_shape = hugging_face_checkpoint(c);
  wrong_shape.erase("bert.encoder.layer.0.intermediate.dense.bias");
  wrong_shape.add("bert.encoder.layer.0.intermediate.dense.bias", {511}, 0);
  EXPECT_NE(load_error(wrong_shape, layout)
                .find("'bert.encoder.layer.0.intermediate.dense.bias' has shape [511], the model needs [512]"),
            std::string::npos);

  Checkpoint untied = hugging_face_checkpoint(c);
  untied.values["cls.predictions.decoder.weight"][5] += 1;
  EXPECT_NE(load_error(untied, layout).find("untied decoder"), std::string::npos);

  Checkpoint twice = hugging_face_checkpoint(c);
  twice.values["bert.embeddings.LayerNorm.gamma"] = twice.values["bert.embeddings.LayerNorm.weight"];
  twice.shapes["bert.embeddings.LayerNorm.gamma"] = {c.hidden};
  twice.order.push_back("bert.embeddings.LayerNorm.gamma");
  EXPECT_NE(load_error(twice, layout).find("are the same parameter"), std::string::npos);

  // A wrong buffer size, and an integer tensor where weights belong.
  std::vector<std::byte> small(layout.flat_bytes() - 2);
  EXPECT_THROW(load_bert_state_dict(hugging_face_checkpoint(c).views(), layout, small), std::invalid_argument);
  Checkpoint ints = hugging_face_checkpoint(c);
  std::vector<TensorView> views = ints.views();
  std::vector<int32_t> ones(c.hidden, 1);
  for (TensorView& v : views) {
    if (v.name == "bert.embeddings.LayerNorm.bias") {
      v.type = TensorType::i32;
      v.bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(ones.data()), ones.size() * 4);
    }
  }
  std::vector<std::byte> flat(layout.flat_bytes());
  try {
    load_bert_state_dict(views, layout, flat);
    FAIL() << "no error for an I32 weight";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has dtype I32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusekit::models
