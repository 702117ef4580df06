// BERT MLM's parameter list: Hugging Face's names and shapes, the exact count, the decaying
// parameters first, the flat layout's alignment, and the packed QKV rows.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "models/bert_parameters.h"

namespace fusekit::models {
namespace {

TEST(BertParameters, BertBaseCountIsHuggingFaces) {
  // BertForMaskedLM (bert-base-uncased), decoder tied to the word embeddings, no pooler:
  //   embeddings: 30522*768 + 512*768 + 2*768 + 2*768                  = 23,837,184
  //   per layer:  3*(768*768 + 768)   Q, K, V                            =  1,771,776
  //               768*768 + 768       attention output                   =    590,592
  //               2*768               its LayerNorm                      =      1,536
  //               768*3072 + 3072     intermediate                       =  2,362,368
  //               3072*768 + 768      output                             =  2,360,064
  //               2*768               its LayerNorm                      =      1,536
  //                                                                        = 7,087,872; x 12 = 85,054,464
  //   MLM head:   768*768 + 768 (transform) + 2*768 (LayerNorm) + 30522 (decoder bias) = 622,650
  //   total: 23,837,184 + 85,054,464 + 622,650 = 109,514,298, what
  //   sum(p.numel() for p in BertForMaskedLM.from_pretrained("bert-base-uncased").parameters()) gives.
  const BertConfig base = bert_preset("bert-base");
  for (QkvLayout qkv : {QkvLayout::separate, QkvLayout::packed}) {
    const BertParameterLayout layout(base, qkv, kernels::DType::f16);
    EXPECT_EQ(layout.parameter_count(), 109514298u);
  }
  EXPECT_EQ(BertParameterLayout(base, QkvLayout::separate, kernels::DType::f16).parameters().size(), 5u + 12 * 16 + 5);
  EXPECT_EQ(BertParameterLayout(base, QkvLayout::packed, kernels::DType::f16).parameters().size(), 5u + 12 * 12 + 5);
  // BERT-large: embeddings 31,782,912, 24 layers of 12,596,224, head 1,082,170 = 335,174,458.
  EXPECT_EQ(BertParameterLayout(bert_preset("bert-large"), QkvLayout::packed, kernels::DType::bf16).parameter_count(),
            335174458u);
}

TEST(BertParameters, HuggingFaceNamesAndShapes) {
  const BertParameterLayout layout(bert_preset("bert-base"), QkvLayout::separate, kernels::DType::f16);
  const auto shape = [&](const char* name) {
    const BertParameter* p = layout.find(name);
    EXPECT_NE(p, nullptr) << name;
    return p ? p->shape : std::vector<int64_t>{};
  };
  EXPECT_EQ(shape("bert.embeddings.word_embeddings.weight"), (std::vector<int64_t>{30522, 768}));
  EXPECT_EQ(shape("bert.embeddings.position_embeddings.weight"), (std::vector<int64_t>{512, 768}));
  EXPECT_EQ(shape("bert.embeddings.token_type_embeddings.weight"), (std::vector<int64_t>{2, 768}));
  EXPECT_EQ(shape("bert.embeddings.LayerNorm.weight"), (std::vector<int64_t>{768}));
  EXPECT_EQ(shape("bert.encoder.layer.11.attention.self.query.weight"), (std::vector<int64_t>{768, 768}));
  EXPECT_EQ(shape("bert.encoder.layer.0.attention.self.value.bias"), (std::vector<int64_t>{768}));
  EXPECT_EQ(shape("bert.encoder.layer.3.attention.output.dense.weight"), (std::vector<int64_t>{768, 768}));
  EXPECT_EQ(shape("bert.encoder.layer.3.attention.output.LayerNorm.bias"), (std::vector<int64_t>{768}));
  EXPECT_EQ(shape("bert.encoder.layer.3.intermediate.dense.weight"), (std::vector<int64_t>{3072, 768}));
  EXPECT_EQ(shape("bert.encoder.layer.3.output.dense.weight"), (std::vector<int64_t>{768, 3072}));
  EXPECT_EQ(shape("bert.encoder.layer.3.output.LayerNorm.weight"), (std::vector<int64_t>{768}));
  EXPECT_EQ(shape("cls.predictions.transform.dense.weight"), (std::vector<int64_t>{768, 768}));
  EXPECT_EQ(shape("cls.predictions.transform.LayerNorm.bias"), (std::vector<int64_t>{768}));
  EXPECT_EQ(shape("cls.predictions.bias"), (std::vector<int64_t>{30522}));
  EXPECT_EQ(layout.find("cls.predictions.decoder.weight"), nullptr);  // tied
  EXPECT_EQ(layout.find("bert.encoder.layer.12.output.dense.weight"), nullptr);
  EXPECT_EQ(layout.find("bert.encoder.layer.0.attention.self.qkv.weight"), nullptr);
  std::set<std::string> names;
  for (const BertParameter& p : layout.parameters()) EXPECT_TRUE(names.insert(p.name).second) << p.name;
  // Weight decay: the matrices and embeddings, not the biases or LayerNorms.
  EXPECT_TRUE(layout.parameters()[layout.index("bert.embeddings.word_embeddings.weight")].decays);
  EXPECT_FALSE(layout.parameters()[layout.index("bert.encoder.layer.0.output.LayerNorm.weight")].decays);
  EXPECT_FALSE(layout.parameters()[layout.index("cls.predictions.bias")].decays);
}

// AdamWTrainer decays a prefix of the tensors: every decaying parameter comes before every other one,
// each group in Hugging Face's order, and decayed_parameters() is the length of the first group.
TEST(BertParameters, DecayingParametersComeFirstInHuggingFacesOrder) {
  const BertParameterLayout tiny(bert_preset("bert-tiny"), QkvLayout::packed, kernels::DType::f16);
  std::vector<std::string> decaying = {"bert.embeddings.word_embeddings.weight",
                                       "bert.embeddings.position_embeddings.weight",
                                       "bert.embeddings.token_type_embeddings.weight"};
  std::vector<std::string> others = {"bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"};
  for (int l = 0; l < 2; ++l) {
    for (const char* suffix : {"attention.self.qkv.weight", "attention.output.dense.weight",
                               "intermediate.dense.weight", "output.dense.weight"}) {
      decaying.push_back(bert_layer_name(l, suffix));
    }
    for (const char* suffix :
         {"attention.self.qkv.bias", "attention.output.dense.bias", "attention.output.LayerNorm.weight",
          "attention.output.LayerNorm.bias", "intermediate.dense.bias", "output.dense.bias", "output.LayerNorm.weight",
          "output.LayerNorm.bias"}) {
      others.push_back(bert_layer_name(l, suffix));
    }
  }
  decaying.push_back("cls.predictions.transform.dense.weight");
  for (const char* name : {"cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
                           "cls.predictions.transform.LayerNorm.bias", "cls.predictions.bias"}) {
    others.push_back(name);
  }
  std::vector<std::string> expected = decaying;
  expected.insert(expected.end(), others.begin(), others.end());
  std::vector<std::string> names;
  for (const BertParameter& p : tiny.parameters()) names.push_back(p.name);
  EXPECT_EQ(names, expected);
  EXPECT_EQ(tiny.decayed_parameters(), decaying.size());

  // BERT-base, both QKV layouts: decays exactly below decayed_parameters(). Decaying elements: the
  // embeddings 23,835,648, per layer 4 x 768^2 + 2 x 768 x 3072 = 7,077,888, the head's dense 589,824.
  for (QkvLayout qkv : {QkvLayout::separate, QkvLayout::packed}) {
    const BertParameterLayout layout(bert_preset("bert-base"), qkv, kernels::DType::bf16);
    EXPECT_EQ(layout.decayed_parameters(), qkv == QkvLayout::separate ? 3u + 12 * 6 + 1 : 3u + 12 * 4 + 1);
    size_t decayed_elements = 0;
    for (size_t i = 0; i < layout.parameters().size(); ++i) {
      EXPECT_EQ(layout.parameters()[i].decays, i < layout.decayed_parameters()) << layout.parameters()[i].name;
      if (layout.parameters()[i].decays) decayed_elements += layout.parameters()[i].elements;
    }
    EXPECT_EQ(decayed_elements, 23835648u + 12 * 7077888u + 589824u);
    EXPECT_EQ(layout.parameter_count() - decayed_elements, 154170u);  // biases and LayerNorms
  }
}

TEST(BertParameters, FlatLayoutIsAlignedAndDisjoint) {
  for (kernels::DType storage : {kernels::DType::f16, kernels::DType::bf16, kernels::DType::f32}) {
    const BertParameterLayout layout(bert_preset("bert-tiny"), QkvLayout::packed, storage);
    const size_t element = dtype_bytes(storage);
    EXPECT_EQ(layout.alignment_elements() * element, 16u);
    size_t end = 0;
    for (const BertParameter& p : layout.parameters()) {
      EXPECT_EQ(p.offset * element % 16, 0u) << p.name;
      EXPECT_GE(p.offset, end) << p.name;                                // in order, no overlap
      EXPECT_LT(p.offset - end, layout.alignment_elements()) << p.name;  // padding only to the boundary
      end = p.offset + p.elements;
    }
    EXPECT_EQ(layout.flat_elements(),
              (end + layout.alignment_elements() - 1) / layout.alignment_elements() * layout.alignment_elements());
  }
  // The vocabulary (30522, not a multiple of 8) pads the decoder bias: the only odd-sized tensor.
  const BertParameterLayout tiny(bert_preset("bert-tiny"), QkvLayout::packed, kernels::DType::f16);
  EXPECT_EQ(tiny.flat_elements(), tiny.parameter_count() + 6);
}

TEST(BertParameters, PackedQkvRows) {
  const BertParameterLayout layout(bert_preset("bert-tiny"), QkvLayout::packed, kernels::DType::f16);
  const BertParameter& weight = layout.parameters()[layout.index("bert.encoder.layer.1.attention.self.qkv.weight")];
  EXPECT_EQ(weight.shape, (std::vector<int64_t>{384, 128}));
  EXPECT_EQ(layout.parameters()[layout.index("bert.encoder.layer.1.attention.self.qkv.bias")].shape,
            (std::vector<int64_t>{384}));
  for (int which = 0; which < 3; ++which) {
    const QkvRows rows = layout.qkv_rows(1, which, false);
    EXPECT_EQ(layout.parameters()[rows.parameter].name, weight.name);
    EXPECT_EQ(rows.first_row, 128u * which);
    EXPECT_EQ(rows.rows, 128u);
  }
  EXPECT_EQ(layout.qkv_rows(0, 2, true).first_row, 256u);
  EXPECT_THROW(layout.qkv_rows(0, 3, true), std::out_of_range);
  EXPECT_THROW(
      BertParameterLayout(bert_preset("bert-tiny"), QkvLayout::separate, kernels::DType::f16).qkv_rows(0, 0, 0),
      std::logic_error);
}

}  // namespace
}  // namespace fusekit::models
