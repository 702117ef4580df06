// The fused step's memory plan: its total against a hand count for a tiny config, no two buffers
// overlapping, what is saved and what is not.
#include <gtest/gtest.h>

#include <algorithm>

#include "models/bert_parameters.h"
#include "models/memory_plan.h"

namespace fusekit::models {
namespace {

TEST(MemoryPlan, TinyConfigMatchesAHandCount) {
  // bert-tiny, batch 2, sequence 16, fp16: N = 32 tokens, H = 128, I = 512, 2 heads, vocab 30522,
  // M = 2 x round(0.15 x 14) = 4 masked rows. Every buffer is rounded up to 256 bytes.
  //   inputs: ids, types, positions (32 x 8 = 256 each), lengths (8), masked positions (16),
  //           masked labels (32): 6 x 256                                                 =   1,536
  //   embeddings: LayerNorm output 32 x 128 x 2 = 8,192, mean and rstd 256 each             =   8,704
  //   per layer: qkv 32 x 384 x 2 = 24,576; context, dense, attention LN, ffn.down, output LN
  //              8,192 each = 40,960; lse 2 x 2 x 16 x 4 = 256; ffn.up and ffn.gelu 32,768 each
  //              = 65,536; four LayerNorm statistics 1,024                               = 132,352
  //   2 layers                                                                            = 264,704
  //   head: gathered, dense, gelu, LayerNorm 4 x 128 x 2 = 1,024 each = 4,096; mean, rstd, logsumexp,
  //         losses, mean loss, valid rows 256 each = 1,536; logits 4 x 30522 x 2 = 244,176 -> 244,224 = 249,856
  //   gradients: dloss 256; logits 244,224; two head rows 1,024 each; four hidden 8,192 each;
  //              intermediate 32,768; qkv 24,576                                          = 336,640
  //   workspace: the attention backward's 2 x 2 x 16 floats                              =     256
  //   total                                                                               = 861,696
  const BertConfig config = parse_bert_config("bert-tiny:b2:s16:fp16");
  const MemoryPlan plan(config);
  EXPECT_EQ(plan.masked_rows(), 4);
  EXPECT_EQ(plan.arena_bytes(), 861696u);
  EXPECT_EQ(plan.buffer("head.logits").bytes, 244176u);
  EXPECT_EQ(plan.buffer("layer.1.attention.lse").shape, (std::vector<int64_t>{2, 2, 16}));
  // The kernels' workspaces, given: the shared one is the largest of them, the embedding's apart.
  const MemoryPlan with_workspaces(config, {1000, 5000, 3000, 7000});
  EXPECT_EQ(with_workspaces.arena_bytes(), 861696u - 256 + 7168 + 1024);
  EXPECT_EQ(with_workspaces.buffer("workspace.backward").bytes, 7000u);
  EXPECT_EQ(with_workspaces.buffer("workspace.embedding_backward").bytes, 1000u);
  // Outside the arena: fp16 parameters and gradients, fp32 moments (and master weights).
  const BertParameterLayout layout(config, QkvLayout::packed, kernels::DType::f16);
  EXPECT_EQ(plan.parameter_bytes(), layout.flat_bytes());
  EXPECT_EQ(plan.trainer_bytes(false), 2 * 2 * layout.flat_elements() + 2 * 4 * layout.flat_elements());
  EXPECT_EQ(plan.total_bytes(true),
            plan.arena_bytes() + 2 * 2 * layout.flat_elements() + 3 * 4 * layout.flat_elements());
}

TEST(MemoryPlan, BuffersAreAlignedAndDisjoint) {
  for (const char* spec : {"bert-tiny:b2:s16", "bert-base:b64:s128:fp16", "bert-large:b8:s512:bf16"}) {
    const MemoryPlan plan(parse_bert_config(spec), {123, 4567, 89, 10});
    std::vector<PlannedBuffer> buffers = plan.buffers();
    std::sort(buffers.begin(), buffers.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    for (size_t i = 0; i < buffers.size(); ++i) {
      EXPECT_EQ(buffers[i].offset % MemoryPlan::kAlignment, 0u) << buffers[i].name;
      EXPECT_GT(buffers[i].bytes, 0u) << buffers[i].name;
      const size_t end = buffers[i].offset + buffers[i].bytes;
      if (i + 1 < buffers.size()) {
        EXPECT_LE(end, buffers[i + 1].offset) << buffers[i].name << " overlaps " << buffers[i + 1].name;
      } else {
        EXPECT_LE(end, plan.arena_bytes());
      }
    }
  }
}

TEST(MemoryPlan, SavesNoMasksOrProbabilities) {
  const BertConfig config = parse_bert_config("bert-base:b32:s512:bf16");
  const MemoryPlan plan(config);
  for (const PlannedBuffer& b : plan.buffers()) {
    EXPECT_EQ(b.name.find("mask"), b.name.find("masked_")) << b.name;  // no dropout mask
    // No [batch, heads, seq, seq] probabilities: no buffer holds seq twice in its shape.
    EXPECT_LE(std::count(b.shape.begin(), b.shape.end(), config.sequence), 1) << b.name;
  }
  EXPECT_EQ(plan.masked_rows(), 32 * 76);
  // bert-base, 16k tokens: saved activations are per layer 8 [N, H] (qkv counts 3) and 2 [N, 4H] in
  // bf16: 16384 x (8 x 768 + 2 x 3072) x 2 bytes = 384 MiB a layer, 4.5 GiB for 12; the statistics,
  // the embeddings and the head (logits 2432 x 30522 x 2 = 142 MiB) bring it to 4.69 GiB.
  const double saved_gib = static_cast<double>(plan.bytes_of(BufferKind::saved)) / (1 << 30);
  EXPECT_GT(saved_gib, 4.6);
  EXPECT_LT(saved_gib, 4.8);
  const std::string table = plan.table();
  EXPECT_NE(table.find("layer.11.ffn.gelu"), std::string::npos);
  EXPECT_NE(table.find("16384x3072"), std::string::npos);
  EXPECT_NE(table.find("arena"), std::string::npos);
}

}  // namespace
}  // namespace fusekit::models
