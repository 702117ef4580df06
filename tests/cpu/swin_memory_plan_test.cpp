// The fused Swin step's memory plan (models/swin_memory_plan.h): the sizes at Swin-T, a block's saved
// bytes against a hand count, no two buffers overlapping, gradients sized for the largest stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "models/swin_memory_plan.h"
#include "models/swin_parameters.h"

namespace fusekit::models {
namespace {

int64_t elements(const PlannedBuffer& b) {
  int64_t n = 1;
  for (int64_t d : b.shape) n *= d;
  return n;
}

TEST(SwinMemoryPlan, SwinTinyShapes) {
  const SwinMemoryPlan plan(parse_swin_config("swin-t:b128:fp16"));
  // 224 / 4 = 56 patches a side: 128 x 56 x 56 = 401,408 tokens of 3 x 4 x 4 = 48 pixels.
  EXPECT_EQ(plan.buffer("patch_embed.columns").shape, (std::vector<int64_t>{401408, 48}));
  EXPECT_EQ(plan.buffer("stage.0.block.1.qkv").shape, (std::vector<int64_t>{401408, 288}));
  // Stage 1: 28 x 28 tokens of 192, merged from 4 x 96 = 384 channels.
  EXPECT_EQ(plan.buffer("stage.1.downsample.merged").shape, (std::vector<int64_t>{100352, 384}));
  EXPECT_EQ(plan.buffer("stage.1.downsample.output").shape, (std::vector<int64_t>{100352, 192}));
  // Stage 2, 6 blocks, 12 heads: 128 x 14 x 14 tokens in 49-token windows.
  EXPECT_EQ(plan.buffer("stage.2.block.5.attention.lse").shape, (std::vector<int64_t>{512, 12, 49}));
  EXPECT_EQ(plan.buffer("stage.2.block.5.attention.bias").shape, (std::vector<int64_t>{12, 49, 49}));
  EXPECT_EQ(plan.buffer("stage.2.block.5.qkv").layer, 9);  // 2 + 2 + 5
  // The last stage: 7 x 7 tokens, one window per image.
  EXPECT_EQ(plan.buffer("stage.3.block.1.attention.lse").shape, (std::vector<int64_t>{128, 24, 49}));
  EXPECT_EQ(plan.buffer("norm").shape, (std::vector<int64_t>{6272, 768}));
  EXPECT_EQ(plan.buffer("pooled").shape, (std::vector<int64_t>{128, 768}));
  EXPECT_EQ(plan.buffer("head.logits").shape, (std::vector<int64_t>{128, 1000}));
  EXPECT_THROW(plan.buffer("stage.4.block.0.qkv"), std::out_of_range);
}

TEST(SwinMemoryPlan, ABlocksSavedBytesMatchAHandCount) {
  // swin-test (image 56, C 32, heads 1-2), batch 2, fp16. Stage 0: 2 x 14 x 14 = 392 tokens of 32, 8
  // windows of 49, 1 head. A block saves: norm1 mean + rstd 2 x 392 x 4 = 3,136; windows, attention
  // output, x1, norm2, output 5 x 392 x 32 x 2 = 125,440; qkv 392 x 96 x 2 = 75,264; lse 8 x 1 x 49 x 4
  // = 1,568; bias 1 x 49 x 49 x 4 = 9,604; norm2 mean + rstd 3,136; up and gelu 2 x 392 x 128 x 2 =
  // 200,704: 418,852 bytes.
  const SwinMemoryPlan plan(parse_swin_config("swin-test:b2:fp16"));
  size_t block0 = 0;
  for (const PlannedBuffer& b : plan.buffers()) {
    if (b.layer == 0) block0 += b.bytes;
  }
  EXPECT_EQ(block0, 418852u);
}

TEST(SwinMemoryPlan, BuffersAreAlignedAndApart) {
  for (const char* spec : {"swin-t:b128:fp16", "swin-b:b64:bf16", "swin-test:b3:fp16"}) {
    SwinKernelWorkspaces workspaces;
    workspaces.window_attention = 12345;
    const SwinMemoryPlan plan(parse_swin_config(spec), workspaces);
    std::set<std::string> names;
    size_t end = 0;
    for (const PlannedBuffer& b : plan.buffers()) {
      EXPECT_TRUE(names.insert(b.name).second) << spec << ": " << b.name << " twice";
      EXPECT_EQ(b.offset % BufferArena::kAlignment, 0u) << b.name;
      EXPECT_GE(b.offset, end) << spec << ": " << b.name << " overlaps the buffer before it";
      end = b.offset + b.bytes;
    }
    EXPECT_LE(end, plan.arena_bytes());
    EXPECT_EQ(plan.buffer("workspace.backward").bytes, 12345u);
  }
}

TEST(SwinMemoryPlan, GradientsFitTheLargestStage) {
  const SwinConfig config = parse_swin_config("swin-t:b16:fp16");
  const SwinMemoryPlan plan(config);
  for (int s = 0; s < config.stages(); ++s) {
    const int64_t T = config.tokens(s), D = config.stage_dim(s);
    EXPECT_GE(elements(plan.buffer("grad.stream.0")), T * D);
    EXPECT_GE(elements(plan.buffer("grad.qkv")), T * 3 * D);
    EXPECT_GE(elements(plan.buffer("grad.hidden")), T * 4 * D);
    EXPECT_GE(elements(plan.buffer("scratch.branch")), T * D);
  }
  // Swin halves the tokens x width product at each merge: stage 0 is the largest.
  EXPECT_EQ(elements(plan.buffer("grad.hidden")), config.tokens(0) * 4 * config.embed_dim);
}

TEST(SwinMemoryPlan, TrainerBytesAndTable) {
  const SwinConfig config = parse_swin_config("swin-t:b128:fp16");
  const SwinMemoryPlan plan(config);
  const SwinParameterLayout layout(config, config.dtype);
  EXPECT_EQ(plan.parameter_bytes(), layout.flat_bytes());
  EXPECT_EQ(plan.trainer_bytes(true) - plan.trainer_bytes(false), 4 * layout.flat_elements());
  EXPECT_EQ(plan.total_bytes(false), plan.arena_bytes() + plan.trainer_bytes(false));
  const std::string table = plan.table();
  EXPECT_NE(table.find("memory plan: swin-t:b128:fp16"), std::string::npos) << table.substr(0, 200);
  EXPECT_NE(table.find("stage.3.block.1.output"), std::string::npos);
  EXPECT_THROW(SwinMemoryPlan(parse_swin_config("swin-t:b1:fp16")).buffer("nothing"), std::out_of_range);
}

}  // namespace
}  // namespace fusekit::models
