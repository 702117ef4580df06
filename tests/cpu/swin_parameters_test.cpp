// Swin's parameter list: timm's names and shapes, the exact counts, the decaying parameters first,
// the flat layout's alignment, and the buffers a loader skips.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "models/swin_parameters.h"

namespace fusekit::models {
namespace {

TEST(SwinParameters, CountsAreTimms) {
  // sum(p.numel() for p in timm.create_model("swin_tiny_patch4_window7_224").parameters()):
  //   patch embedding: 96*3*4*4 + 96 + 2*96                                     =      4,896
  //   a block of width D, h heads: 4D (2 LayerNorms) + 169h (bias table) + 3D^2 + 3D (qkv)
  //     + D^2 + D (proj) + 4D^2 + 4D (fc1) + 4D^2 + D (fc2) = 12D^2 + 13D + 169h
  //   stage 0, D 96, h 3:   2 x 111,603                                           =    223,206
  //   stage 1: merging 384*2 + 384*192 = 74,496; D 192, h 6: 2 x 445,878         =    966,252
  //   stage 2: merging 768*2 + 768*384 = 296,448; D 384, h 12: 6 x 1,776,408     = 10,954,896
  //   stage 3: merging 1536*2 + 1536*768 = 1,182,720; D 768, h 24: 2 x 7,092,168  = 15,367,056
  //   final norm 2*768 + head 768*1000 + 1000                                     =    770,536
  //   total                                                                       = 28,288,354
  const SwinParameterLayout t(swin_preset("swin-t"), kernels::DType::f16);
  EXPECT_EQ(t.parameter_count(), 28288354u);
  EXPECT_EQ(t.parameters().size(), 4u + 3 * 3 + 12 * 13 + 4);
  // Swin-B (swin_base_patch4_window7_224), the same sums at C 128, depths 2-2-18-2, heads 4-8-16-32.
  const SwinParameterLayout b(swin_preset("swin-b"), kernels::DType::bf16);
  EXPECT_EQ(b.parameter_count(), 87768224u);
  EXPECT_EQ(b.parameters().size(), 4u + 3 * 3 + 24 * 13 + 4);
  // The test preset: patch embedding 32*48 + 32 + 2*32, stage 0 (D 32, h 1) 2 x 12,873, merging
  // 2*128 + 128*64, stage 1 (D 64, h 2) 2 x 50,322, final norm 2*64, head 64*10 + 10: 137,248.
  const SwinParameterLayout test(swin_preset("swin-test"), kernels::DType::f32);
  EXPECT_EQ(test.parameter_count(), 32u * 48 + 32 + 64 + 2 * 12873 + 256 + 8192 + 2 * 50322 + 128 + 650);
  EXPECT_EQ(test.parameter_count(), 137248u);
}

TEST(SwinParameters, TimmNamesAndShapes) {
  const SwinParameterLayout layout(swin_preset("swin-t"), kernels::DType::f16);
  const auto shape = [&](const std::string& name) {
    const SwinParameter* p = layout.find(name);
    EXPECT_NE(p, nullptr) << name;
    return p ? p->shape : std::vector<int64_t>{};
  };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("patch_embed.proj.weight"), (S{96, 3, 4, 4}));
  EXPECT_EQ(shape("patch_embed.proj.bias"), (S{96}));
  EXPECT_EQ(shape("patch_embed.norm.weight"), (S{96}));
  EXPECT_EQ(shape("patch_embed.norm.bias"), (S{96}));
  EXPECT_EQ(shape("layers.0.blocks.0.norm1.weight"), (S{96}));
  EXPECT_EQ(shape("layers.0.blocks.1.attn.relative_position_bias_table"), (S{169, 3}));
  EXPECT_EQ(shape("layers.0.blocks.1.attn.qkv.weight"), (S{288, 96}));
  EXPECT_EQ(shape("layers.0.blocks.1.attn.qkv.bias"), (S{288}));
  EXPECT_EQ(shape("layers.0.blocks.1.attn.proj.weight"), (S{96, 96}));
  EXPECT_EQ(shape("layers.0.blocks.1.attn.proj.bias"), (S{96}));
  EXPECT_EQ(shape("layers.0.blocks.1.norm2.bias"), (S{96}));
  EXPECT_EQ(shape("layers.0.blocks.1.mlp.fc1.weight"), (S{384, 96}));
  EXPECT_EQ(shape("layers.0.blocks.1.mlp.fc1.bias"), (S{384}));
  EXPECT_EQ(shape("layers.0.blocks.1.mlp.fc2.weight"), (S{96, 384}));
  EXPECT_EQ(shape("layers.0.blocks.1.mlp.fc2.bias"), (S{96}));
  // timm 1.x: the patch merging opens stages 1..3 (4 x the previous width in, 2 x out, no bias).
  EXPECT_EQ(layout.find("layers.0.downsample.norm.weight"), nullptr);
  EXPECT_EQ(shape("layers.1.downsample.norm.weight"), (S{384}));
  EXPECT_EQ(shape("layers.1.downsample.norm.bias"), (S{384}));
  EXPECT_EQ(shape("layers.1.downsample.reduction.weight"), (S{192, 384}));
  EXPECT_EQ(layout.find("layers.1.downsample.reduction.bias"), nullptr);
  EXPECT_EQ(shape("layers.2.downsample.reduction.weight"), (S{384, 768}));
  EXPECT_EQ(shape("layers.3.downsample.norm.weight"), (S{1536}));
  EXPECT_EQ(shape("layers.3.downsample.reduction.weight"), (S{768, 1536}));
  EXPECT_EQ(layout.find("layers.4.downsample.norm.weight"), nullptr);
  EXPECT_EQ(shape("layers.2.blocks.5.attn.relative_position_bias_table"), (S{169, 12}));
  EXPECT_EQ(layout.find("layers.2.blocks.6.norm1.weight"), nullptr);
  EXPECT_EQ(shape("layers.3.blocks.1.attn.qkv.weight"), (S{2304, 768}));
  EXPECT_EQ(shape("layers.3.blocks.1.mlp.fc1.weight"), (S{3072, 768}));
  EXPECT_EQ(shape("norm.weight"), (S{768}));
  EXPECT_EQ(shape("norm.bias"), (S{768}));
  EXPECT_EQ(shape("head.fc.weight"), (S{1000, 768}));
  EXPECT_EQ(shape("head.fc.bias"), (S{1000}));
  EXPECT_EQ(layout.find("head.weight"), nullptr);  // the pre-1.0 name
  EXPECT_EQ(swin_block_name(2, 5, "attn.qkv.weight"), "layers.2.blocks.5.attn.qkv.weight");
  EXPECT_THROW(layout.index("layers.0.blocks.0.attn.relative_position_index"), std::out_of_range);

  const SwinParameterLayout b(swin_preset("swin-b"), kernels::DType::f16);
  EXPECT_EQ(b.find("layers.2.blocks.17.attn.relative_position_bias_table")->shape, (S{169, 16}));
  EXPECT_EQ(b.find("layers.3.downsample.reduction.weight")->shape, (S{1024, 2048}));
  EXPECT_EQ(b.find("head.fc.weight")->shape, (S{1000, 1024}));

  for (const SwinParameterLayout* l : {&layout, &b}) {
    std::set<std::string> names;
    for (const SwinParameter& p : l->parameters()) {
      EXPECT_TRUE(names.insert(p.name).second) << p.name;
      EXPECT_FALSE(swin_ignored_buffer(p.name)) << p.name;
    }
  }
}

TEST(SwinParameters, BuffersAreIgnoredNames) {
  EXPECT_TRUE(swin_ignored_buffer("layers.0.blocks.0.attn.relative_position_index"));
  EXPECT_TRUE(swin_ignored_buffer("layers.0.blocks.1.attn_mask"));
  EXPECT_TRUE(swin_ignored_buffer("layers.2.blocks.3.attn.relative_coords_table"));
  EXPECT_FALSE(swin_ignored_buffer("layers.0.blocks.1.attn.relative_position_bias_table"));
  EXPECT_FALSE(swin_ignored_buffer("layers.0.blocks.1.attn.qkv.weight"));
  EXPECT_FALSE(swin_ignored_buffer("head.fc.weight"));
}

// What decays: the Linear and Conv2d weights; biases, LayerNorms and the bias tables do not. The
// decaying parameters come first, each group in timm's order.
TEST(SwinParameters, DecayingParametersComeFirstInTimmsOrder) {
  const SwinParameterLayout test(swin_preset("swin-test"), kernels::DType::f16);
  std::vector<std::string> decaying = {"patch_embed.proj.weight"};
  std::vector<std::string> others = {"patch_embed.proj.bias", "patch_embed.norm.weight", "patch_embed.norm.bias"};
  for (int s = 0; s < 2; ++s) {
    if (s > 0) {
      others.push_back("layers.1.downsample.norm.weight");
      others.push_back("layers.1.downsample.norm.bias");
      decaying.push_back("layers.1.downsample.reduction.weight");
    }
    for (int b = 0; b < 2; ++b) {
      for (const char* suffix : {"attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"}) {
        decaying.push_back(swin_block_name(s, b, suffix));
      }
      for (const char* suffix : {"norm1.weight", "norm1.bias", "attn.relative_position_bias_table", "attn.qkv.bias",
                                 "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.bias", "mlp.fc2.bias"}) {
        others.push_back(swin_block_name(s, b, suffix));
      }
    }
  }
  decaying.push_back("head.fc.weight");
  for (const char* name : {"norm.weight", "norm.bias", "head.fc.bias"}) others.push_back(name);
  std::vector<std::string> expected = decaying;
  expected.insert(expected.end(), others.begin(), others.end());
  std::vector<std::string> names;
  for (const SwinParameter& p : test.parameters()) names.push_back(p.name);
  EXPECT_EQ(names, expected);
  EXPECT_EQ(test.decayed_parameters(), decaying.size());

  // Swin-T: decays exactly below decayed_parameters(). Decaying elements: the patch embedding's
  // 4,608, per block 12 D^2 (2 x 110,592 + 2 x 442,368 + 6 x 1,769,472 + 2 x 7,077,888), the
  // reductions 73,728 + 294,912 + 1,179,648, the head's 768,000.
  const SwinParameterLayout t(swin_preset("swin-t"), kernels::DType::bf16);
  EXPECT_EQ(t.decayed_parameters(), 1u + 12 * 4 + 3 + 1);
  size_t decayed_elements = 0;
  for (size_t i = 0; i < t.parameters().size(); ++i) {
    EXPECT_EQ(t.parameters()[i].decays, i < t.decayed_parameters()) << t.parameters()[i].name;
    if (t.parameters()[i].decays) decayed_elements += t.parameters()[i].elements;
  }
  const size_t expected_decayed =
      4608u + 2 * 110592u + 2 * 442368u + 6 * 1769472u + 2 * 7077888u + 73728u + 294912u + 1179648u + 768000u;
  EXPECT_EQ(decayed_elements, expected_decayed);
  EXPECT_EQ(t.parameter_sizes().size(), t.parameters().size());
}

TEST(SwinParameters, FlatLayoutIsAlignedAndDisjoint) {
  for (const char* preset : {"swin-test", "swin-t"}) {
    for (kernels::DType storage : {kernels::DType::f16, kernels::DType::bf16, kernels::DType::f32}) {
      const SwinParameterLayout layout(swin_preset(preset), storage);
      const size_t element = dtype_bytes(storage);
      EXPECT_EQ(layout.alignment_elements() * element, 16u);
      size_t end = 0, padding = 0;
      for (const SwinParameter& p : layout.parameters()) {
        EXPECT_EQ(p.offset * element % 16, 0u) << p.name;
        EXPECT_GE(p.offset, end) << p.name;                                // in order, no overlap
        EXPECT_LT(p.offset - end, layout.alignment_elements()) << p.name;  // padding only to the boundary
        padding += p.offset - end;
        end = p.offset + p.elements;
      }
      const size_t flat =
          (end + layout.alignment_elements() - 1) / layout.alignment_elements() * layout.alignment_elements();
      EXPECT_EQ(layout.flat_elements(), flat);
      EXPECT_EQ(layout.flat_elements(), layout.parameter_count() + padding + (flat - end));
      EXPECT_EQ(layout.flat_bytes(), layout.flat_elements() * element);
    }
  }
  // The bias tables (169 x heads: odd for odd heads) and the test preset's 10 classes are the
  // tensors that pad: Swin-T's stage 0 tables (169 x 3 = 507) pad by 5 elements each in fp16.
  const SwinParameterLayout t(swin_preset("swin-t"), kernels::DType::f16);
  const size_t table = t.index("layers.0.blocks.0.attn.relative_position_bias_table");
  EXPECT_EQ(t.parameters()[table + 1].offset - t.parameters()[table].offset, 512u);
}

TEST(SwinParameters, RejectsWhatValidateRejects) {
  SwinConfig c = swin_preset("swin-t");
  c.heads = {3, 6, 12};
  EXPECT_THROW(SwinParameterLayout(c, kernels::DType::f16), std::invalid_argument);
  c = swin_preset("swin-t");
  c.dtype = kernels::DType::f32;  // the storage type is the layout's own
  EXPECT_NO_THROW(SwinParameterLayout(c, kernels::DType::f32));
}

}  // namespace
}  // namespace fusekit::models
