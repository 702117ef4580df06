// Swin configs: the presets, the spec string both ways, and one clear error per mistake.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "models/swin_config.h"

namespace fusekit::models {
namespace {

// The message of the std::invalid_argument that parse_swin_config throws, or "" if it throws none.
std::string parse_error(const std::string& spec) {
  try {
    parse_swin_config(spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string error(const SwinConfig& c) {
  try {
    validate(c);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(SwinConfig, Presets) {
  const SwinConfig t = swin_preset("swin-t");
  EXPECT_EQ(t.image_size, 224);
  EXPECT_EQ(t.in_channels, 3);
  EXPECT_EQ(t.patch, 4);
  EXPECT_EQ(t.window, 7);
  EXPECT_EQ(t.embed_dim, 96);
  EXPECT_EQ(t.depths, (std::vector<int>{2, 2, 6, 2}));
  EXPECT_EQ(t.heads, (std::vector<int>{3, 6, 12, 24}));
  EXPECT_EQ(t.mlp_ratio, 4);
  EXPECT_EQ(t.classes, 1000);
  EXPECT_DOUBLE_EQ(t.layer_norm_eps, 1e-5);
  EXPECT_EQ(t.stages(), 4);
  EXPECT_EQ(t.blocks(), 12);
  EXPECT_EQ(t.features(), 768);
  EXPECT_EQ(t.window_tokens(), 49);
  const std::vector<int> dims = {96, 192, 384, 768}, grids = {56, 28, 14, 7};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(t.stage_dim(s), dims[s]);
    EXPECT_EQ(t.stage_resolution(s), grids[s]);
    EXPECT_EQ(t.stage_head_dim(s), 32);
    EXPECT_EQ(t.stage_shifts(s), s < 3) << s;  // the last stage's 7 x 7 grid is one window: no shift
  }
  EXPECT_EQ(t.tokens(0), 3136);
  const SwinConfig b = swin_preset("swin-b");
  EXPECT_EQ(b.embed_dim, 128);
  EXPECT_EQ(b.depths, (std::vector<int>{2, 2, 18, 2}));
  EXPECT_EQ(b.heads, (std::vector<int>{4, 8, 16, 32}));
  EXPECT_EQ(b.features(), 1024);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(b.stage_head_dim(s), 32);
  const SwinConfig test = swin_preset("swin-test");
  EXPECT_EQ(test.image_size, 56);
  EXPECT_EQ(test.embed_dim, 32);
  EXPECT_EQ(test.depths, (std::vector<int>{2, 2}));
  EXPECT_EQ(test.heads, (std::vector<int>{1, 2}));
  EXPECT_EQ(test.stage_resolution(0), 14);
  EXPECT_EQ(test.stage_resolution(1), 7);
  EXPECT_TRUE(test.stage_shifts(0));
  EXPECT_FALSE(test.stage_shifts(1));
  for (int s = 0; s < 2; ++s) EXPECT_EQ(test.stage_head_dim(s), 32);
  for (const std::string& name : swin_preset_names()) EXPECT_NO_THROW(validate(swin_preset(name))) << name;
}

TEST(SwinConfig, ParsesSpecs) {
  const SwinConfig c = parse_swin_config("swin-t:b128:fp16");
  EXPECT_EQ(c.name, "swin-t");
  EXPECT_EQ(c.batch, 128);
  EXPECT_EQ(c.dtype, kernels::DType::f16);
  EXPECT_EQ(c.tokens(0), 128LL * 3136);
  EXPECT_EQ(c.spec(), "swin-t:b128:fp16");
  const SwinConfig b = parse_swin_config("swin-b:bf16:b64");  // any order
  EXPECT_EQ(b.batch, 64);
  EXPECT_EQ(b.dtype, kernels::DType::bf16);
  EXPECT_EQ(b.spec(), "swin-b:b64:bf16");
  for (const std::string& name : swin_preset_names()) {
    for (const char* tail : {"", ":b3", ":bf16", ":b7:fp16"}) {
      const SwinConfig parsed = parse_swin_config(name + tail);
      EXPECT_EQ(parse_swin_config(parsed.spec()).spec(), parsed.spec());
    }
  }
  const SwinConfig defaults = parse_swin_config("swin-test");
  EXPECT_EQ(defaults.batch, 1);
  EXPECT_EQ(defaults.dtype, kernels::DType::f16);
  EXPECT_EQ(defaults.spec(), "swin-test:b1:fp16");
}

TEST(SwinConfig, SpecErrorsSayWhatIsWrong) {
  EXPECT_NE(parse_error("swin-l:b8").find("unknown model 'swin-l'"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:x8").find("unknown field 'x8'"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:s128").find("unknown field 's128'"), std::string::npos);  // no sequence
  EXPECT_NE(parse_error("swin-t:b0").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:b").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:b8x").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:b-1").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:b99999999999").find("positive integer"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:b8:b16").find("given twice"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:fp16:bf16").find("given twice"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:b8:").find("empty field"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:").find("empty field"), std::string::npos);
  EXPECT_NE(parse_error("swin-t::b8").find("unknown field ''"), std::string::npos);
  EXPECT_NE(parse_error("swin-t:fp32").find("fp32 is not supported"), std::string::npos);
  EXPECT_EQ(parse_error("swin-t:b0").rfind("swin config: ", 0), 0u);
  EXPECT_EQ(parse_error("swin-b:b512:bf16"), "");
}

TEST(SwinConfig, ValidationNamesEachLimit) {
  SwinConfig c = swin_preset("swin-t");
  c.image_size = 226;
  EXPECT_NE(error(c).find("image_size 226 is not a multiple of patch 4"), std::string::npos);
  c = swin_preset("swin-t");
  c.image_size = 200;  // grid 50: halves once, not three times
  EXPECT_NE(error(c).find("patch grid 50 (image_size / patch) does not halve 3 times"), std::string::npos);
  c = swin_preset("swin-t");
  c.image_size = 256;  // grid 64, 32, 16, 8: not multiples of 7
  EXPECT_NE(error(c).find("stage 0: grid 64 (image_size / patch / 2^0) is not a multiple of window 7"),
            std::string::npos);
  c = swin_preset("swin-t");
  c.image_size = 384;
  c.window = 12;  // grid 96, 48, 24, 12: timm's window-12 models at 384
  EXPECT_EQ(error(c), "");
  c.window = 8;
  EXPECT_NE(error(c).find("window 8 is not one the window attention kernel has (7, 12)"), std::string::npos);
  c = swin_preset("swin-t");
  c.heads = {3, 6, 12, 7};  // 768 / 7
  EXPECT_NE(error(c).find("stage 3: width 768 is not a multiple of heads 7"), std::string::npos);
  c.heads = {3, 6, 12, 12};  // head_dim 64: supported
  EXPECT_EQ(error(c), "");
  c.heads = {3, 6, 12, 48};  // head_dim 16
  EXPECT_NE(error(c).find("stage 3: head_dim 16 (width 768 / heads 48)"), std::string::npos);
  c.heads = {1, 6, 12, 24};  // head_dim 96
  EXPECT_NE(error(c).find("stage 0: head_dim 96"), std::string::npos);
  c = swin_preset("swin-t");
  c.heads = {3, 6, 12};
  EXPECT_NE(error(c).find("heads 3-6-12 does not give one count per stage of depths 2-2-6-2"), std::string::npos);
  c = swin_preset("swin-t");
  c.depths = {};
  c.heads = {};
  EXPECT_NE(error(c).find("depths is empty"), std::string::npos);
  c = swin_preset("swin-t");
  c.depths[2] = 0;
  EXPECT_NE(error(c).find("depths[2] must be >= 1 (got 0)"), std::string::npos);
  c = swin_preset("swin-t");
  c.heads[1] = -1;
  EXPECT_NE(error(c).find("heads[1] must be >= 1 (got -1)"), std::string::npos);
  c = swin_preset("swin-t");
  c.embed_dim = 0;
  EXPECT_NE(error(c).find("embed_dim must be >= 1"), std::string::npos);
  c = swin_preset("swin-t");
  c.classes = 0;
  EXPECT_NE(error(c).find("classes must be >= 1"), std::string::npos);
  c = swin_preset("swin-t");
  c.patch = 0;
  EXPECT_NE(error(c).find("patch must be >= 1"), std::string::npos);
  c = swin_preset("swin-test");
  c.embed_dim = 34;  // not a multiple of heads: stops before the MLP check
  c.heads = {1, 1};
  EXPECT_NE(error(c).find("stage 0: head_dim 34"), std::string::npos);
  c = swin_preset("swin-t");
  c.mlp_ratio = 0;
  EXPECT_NE(error(c).find("mlp_ratio must be >= 1"), std::string::npos);
  c = swin_preset("swin-t");
  c.layer_norm_eps = 0;
  EXPECT_NE(error(c).find("layer_norm_eps"), std::string::npos);
  c = swin_preset("swin-t");
  c.dtype = kernels::DType::f32;
  EXPECT_NE(error(c).find("fp32 is not supported"), std::string::npos);
  c = swin_preset("swin-t");
  c.batch = 1 << 20;  // 2^20 x 3136 tokens > INT_MAX
  EXPECT_NE(error(c).find("tokens is too large"), std::string::npos);
}

TEST(SwinShiftMask, TimmsRegions) {
  // Resolution 14, window 7, shift 3: window 0 (rows and columns 0..6) lies in one region; window 3
  // (rows and columns 7..13) in four: rows 7..10 and 11..13 by columns 7..10 and 11..13, of 16, 12, 12
  // and 9 tokens, so 16^2 + 12^2 + 12^2 + 9^2 = 625 of its 49^2 pairs share a region.
  const std::vector<float> mask = swin_shift_mask(14, 7, 3);
  ASSERT_EQ(mask.size(), 4u * 49 * 49);
  const auto zeros = [&](int w) {
    int n = 0;
    for (int k = 0; k < 49 * 49; ++k) n += mask[static_cast<size_t>(w) * 49 * 49 + k] == 0.f;
    return n;
  };
  EXPECT_EQ(zeros(0), 49 * 49);
  EXPECT_EQ(zeros(3), 625);
  // Windows 1 and 2 (top right, bottom left) split in two bands: 28^2 + 21^2 pairs.
  EXPECT_EQ(zeros(1), 28 * 28 + 21 * 21);
  EXPECT_EQ(zeros(2), 28 * 28 + 21 * 21);
  // Token (0, 0) of window 3 (image row 7, column 7) against token (6, 6) (row 13, column 13).
  EXPECT_EQ(mask[(3 * 49 + 0) * 49 + 48], -100.f);
  for (float v : mask) EXPECT_TRUE(v == 0.f || v == -100.f);
  EXPECT_THROW(swin_shift_mask(14, 7, 7), std::invalid_argument);
  EXPECT_THROW(swin_shift_mask(15, 7, 3), std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::models
