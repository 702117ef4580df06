// BERT configs: the presets, the spec string both ways, and one clear error per mistake.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "models/bert_config.h"

namespace fusekit::models {
namespace {

// The message of the std::invalid_argument that parse_bert_config throws, or "" if it throws none.
std::string parse_error(const std::string& spec) {
  try {
    parse_bert_config(spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(BertConfig, Presets) {
  const BertConfig base = bert_preset("bert-base");
  EXPECT_EQ(base.layers, 12);
  EXPECT_EQ(base.hidden, 768);
  EXPECT_EQ(base.heads, 12);
  EXPECT_EQ(base.intermediate, 3072);
  EXPECT_EQ(base.head_dim(), 64);
  EXPECT_EQ(base.vocab, 30522);
  EXPECT_EQ(base.max_positions, 512);
  EXPECT_EQ(base.token_types, 2);
  EXPECT_DOUBLE_EQ(base.layer_norm_eps, 1e-12);
  EXPECT_FLOAT_EQ(base.dropout, 0.1f);
  const BertConfig large = bert_preset("bert-large");
  EXPECT_EQ(large.layers, 24);
  EXPECT_EQ(large.hidden, 1024);
  EXPECT_EQ(large.heads, 16);
  EXPECT_EQ(large.intermediate, 4096);
  const BertConfig tiny = bert_preset("bert-tiny");
  EXPECT_EQ(tiny.layers, 2);
  EXPECT_EQ(tiny.hidden, 128);
  EXPECT_EQ(tiny.heads, 2);
  EXPECT_EQ(tiny.intermediate, 512);
  for (const std::string& name : bert_preset_names()) EXPECT_NO_THROW(validate(bert_preset(name))) << name;
}

TEST(BertConfig, ParsesSpecs) {
  const BertConfig c = parse_bert_config("bert-base:b64:s128:fp16");
  EXPECT_EQ(c.name, "bert-base");
  EXPECT_EQ(c.batch, 64);
  EXPECT_EQ(c.sequence, 128);
  EXPECT_EQ(c.tokens(), 8192);
  EXPECT_EQ(c.dtype, kernels::DType::f16);
  EXPECT_EQ(c.spec(), "bert-base:b64:s128:fp16");
  const BertConfig l = parse_bert_config("bert-large:bf16:s512:b8");  // any order
  EXPECT_EQ(l.batch, 8);
  EXPECT_EQ(l.sequence, 512);
  EXPECT_EQ(l.dtype, kernels::DType::bf16);
  EXPECT_EQ(parse_bert_config(l.spec()).spec(), l.spec());
  const BertConfig defaults = parse_bert_config("bert-tiny");
  EXPECT_EQ(defaults.batch, 1);
  EXPECT_EQ(defaults.sequence, 128);
  EXPECT_EQ(defaults.dtype, kernels::DType::f16);
}

TEST(BertConfig, SpecErrorsSayWhatIsWrong) {
  EXPECT_NE(parse_error("bert-huge:b8").find("unknown model 'bert-huge'"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:x8").find("unknown field 'x8'"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b0").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b8x").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b-1").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b99999999999").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b8:b16").find("given twice"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:fp16:bf16").find("given twice"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:b8:").find("empty field"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:").find("empty field"), std::string::npos);
  EXPECT_NE(parse_error("bert-base::b8").find("unknown field ''"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:s513").find("sequence 513 > max_positions 512"), std::string::npos);
  EXPECT_NE(parse_error("bert-base:fp32").find("fp32 is not supported"), std::string::npos);
  EXPECT_EQ(parse_error("bert-base:s512:b2"), "");
}

TEST(BertConfig, ValidationNamesEachLimit) {
  const auto error = [](BertConfig c) -> std::string {
    try {
      validate(c);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  BertConfig c = bert_preset("bert-base");
  c.heads = 10;  // 768 / 10
  EXPECT_NE(error(c).find("hidden 768 is not a multiple of heads 10"), std::string::npos);
  c.heads = 24;  // head_dim 32: supported
  EXPECT_EQ(error(c), "");
  c.heads = 48;  // head_dim 16
  EXPECT_NE(error(c).find("head_dim 16"), std::string::npos);
  c = bert_preset("bert-base");
  c.hidden = 960;  // head_dim 80
  EXPECT_NE(error(c).find("head_dim 80"), std::string::npos);
  c = bert_preset("bert-base");
  c.intermediate = 3074;
  EXPECT_NE(error(c).find("intermediate 3074 is not a multiple of 8"), std::string::npos);
  c = bert_preset("bert-base");
  c.layers = 0;
  EXPECT_NE(error(c).find("layers must be >= 1"), std::string::npos);
  c = bert_preset("bert-base");
  c.dropout = 1.f;
  EXPECT_NE(error(c).find("dropout"), std::string::npos);
  c = bert_preset("bert-base");
  c.layer_norm_eps = 0;
  EXPECT_NE(error(c).find("layer_norm_eps"), std::string::npos);
  c = bert_preset("bert-base");
  c.batch = 1 << 30;
  c.sequence = 512;
  EXPECT_NE(error(c).find("too large"), std::string::npos);
}

}  // namespace
}  // namespace fusekit::models
