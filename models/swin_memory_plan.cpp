#include "models/swin_memory_plan.h"

#include <algorithm>

#include "models/swin_parameters.h"

namespace fusekit::models {

std::string SwinMemoryPlan::block_buffer(int stage, int block, std::string_view what) {
  return "stage." + std::to_string(stage) + ".block." + std::to_string(block) + "." + std::string(what);
}

int SwinMemoryPlan::block_index(int stage, int block) const {
  int index = block;
  for (int s = 0; s < stage; ++s) index += config_.depths[s];
  return index;
}

SwinMemoryPlan::SwinMemoryPlan(const SwinConfig& config, const SwinKernelWorkspaces& workspaces)
    : config_(config), arena_(config.dtype) {
  validate(config);
  using E = ElementType;
  using K = BufferKind;
  const int64_t B = config.batch, C = config.embed_dim, P = config.patch, image = config.image_size;
  const int64_t T0 = config.tokens(0);
  const int64_t patch_features = static_cast<int64_t>(config.in_channels) * P * P;

  arena_.add("input.images", K::input, -1, {B, config.in_channels, image, image}, E::storage);
  arena_.add("input.labels", K::input, -1, {B}, E::i64);
  // Constants, written once: the relative position index of a window (every stage's windows have
  // config.window_tokens() tokens, the last stage's grid being one window where it is no larger),
  // and each shifting stage's mask (models/swin_config.h swin_shift_mask).
  const int64_t window_tokens = config.window_tokens();
  arena_.add("window.index", K::input, -1, {window_tokens, window_tokens}, E::i32);
  for (int s = 0; s < config.stages(); ++s) {
    if (!config.stage_shifts(s)) continue;
    const int64_t per_side = config.stage_resolution(s) / config.window;
    arena_.add("stage." + std::to_string(s) + ".mask", K::input, -1,
               {per_side * per_side, window_tokens, window_tokens}, E::f32);
  }
  // The convolution as a GEMM: each image patch's pixels as a row (channel, row, column order, as
  // the Conv2d weight [C, in_channels, P, P] flattens), then its output and timm's patch norm.
  arena_.add("patch_embed.columns", K::saved, -1, {T0, patch_features}, E::storage);
  arena_.add("patch_embed.proj", K::saved, -1, {T0, C}, E::storage);
  arena_.add("patch_embed.norm", K::saved, -1, {T0, C}, E::storage);
  arena_.add("patch_embed.norm.mean", K::saved, -1, {T0}, E::f32);
  arena_.add("patch_embed.norm.rstd", K::saved, -1, {T0}, E::f32);

  int64_t largest_tokens_by_width = 0, largest_hidden = 0, largest_qkv = 0;
  for (int s = 0; s < config.stages(); ++s) {
    const int64_t T = config.tokens(s), D = config.stage_dim(s), heads = config.heads[s];
    const int64_t side = config.stage_resolution(s);
    const int64_t N = std::min<int64_t>(config.window_tokens(), side * side);
    const int64_t W = T / N;
    largest_tokens_by_width = std::max(largest_tokens_by_width, T * D);
    largest_hidden = std::max(largest_hidden, T * config.mlp_ratio * D);
    largest_qkv = std::max(largest_qkv, T * 3 * D);
    const std::string stage = "stage." + std::to_string(s) + ".";
    if (s > 0) {
      // Patch merging: the previous stage's output gathered 2x2 and normalized over 2D (= 4 x D / 2),
      // then reduced to D: the stage's input.
      arena_.add(stage + "downsample.merged", K::saved, -1, {T, 2 * D}, E::storage);
      arena_.add(stage + "downsample.mean", K::saved, -1, {T}, E::f32);
      arena_.add(stage + "downsample.rstd", K::saved, -1, {T}, E::f32);
      arena_.add(stage + "downsample.output", K::saved, -1, {T, D}, E::storage);
    }
    for (int b = 0; b < config.depths[s]; ++b) {
      const int index = block_index(s, b);
      const auto add = [&](std::string_view what, std::vector<int64_t> shape, E type) {
        arena_.add(block_buffer(s, b, what), K::saved, index, std::move(shape), type);
      };
      add("norm1.mean", {T}, E::f32);
      add("norm1.rstd", {T}, E::f32);
      add("windows", {T, D}, E::storage);
      add("qkv", {T, 3 * D}, E::storage);
      add("attention.out", {T, D}, E::storage);
      add("attention.lse", {W, heads, N}, E::f32);
      add("attention.bias", {heads, N, N}, E::f32);
      add("x1", {T, D}, E::storage);
      add("norm2", {T, D}, E::storage);
      add("norm2.mean", {T}, E::f32);
      add("norm2.rstd", {T}, E::f32);
      add("mlp.up", {T, config.mlp_ratio * D}, E::storage);
      add("mlp.gelu", {T, config.mlp_ratio * D}, E::storage);
      add("output", {T, D}, E::storage);
    }
  }
  const int64_t last = config.stages() - 1, F = config.features(), TL = config.tokens(static_cast<int>(last));
  arena_.add("norm", K::saved, -1, {TL, F}, E::storage);
  arena_.add("norm.mean", K::saved, -1, {TL}, E::f32);
  arena_.add("norm.rstd", K::saved, -1, {TL}, E::f32);
  arena_.add("pooled", K::saved, -1, {B, F}, E::storage);
  arena_.add("head.logits", K::saved, -1, {B, config.classes}, E::storage);
  arena_.add("head.logsumexp", K::saved, -1, {B}, E::f32);
  arena_.add("head.losses", K::output, -1, {B}, E::f32);
  arena_.add("head.mean_loss", K::output, -1, {1}, E::f32);
  arena_.add("head.valid_rows", K::saved, -1, {1}, E::i32);

  // Scratch of the forward: a branch's output before its residual add (projection, fc2).
  arena_.add("scratch.branch", K::workspace, -1, {largest_tokens_by_width}, E::storage);
  // Gradients, sized for the largest stage: the residual stream's (two, ping-ponged) and a branch's,
  // the windows', qkv's, the MLP's hidden, and the head's.
  arena_.add("grad.dloss", K::gradient, -1, {1}, E::f32);
  arena_.add("grad.logits", K::gradient, -1, {B, config.classes}, E::storage);
  arena_.add("grad.pooled", K::gradient, -1, {B, F}, E::storage);
  for (int i = 0; i < 2; ++i) {
    arena_.add("grad.stream." + std::to_string(i), K::gradient, -1, {largest_tokens_by_width}, E::storage);
  }
  arena_.add("grad.branch", K::gradient, -1, {largest_tokens_by_width}, E::storage);
  arena_.add("grad.windows", K::gradient, -1, {largest_tokens_by_width}, E::storage);
  arena_.add("grad.qkv", K::gradient, -1, {largest_qkv}, E::storage);
  arena_.add("grad.hidden", K::gradient, -1, {largest_hidden}, E::storage);
  arena_.add("grad.patch_embed", K::gradient, -1, {T0, C}, E::storage);
  // Where a kernel writes a gradient nothing reads (the pre-LN backward's bias and residual outputs
  // that another buffer already holds): as large as the largest stage's tokens x width.
  arena_.add("grad.unused", K::gradient, -1, {largest_tokens_by_width}, E::storage);

  const size_t backward = std::max({workspaces.layernorm, workspaces.window_partition, workspaces.patch_merging,
                                    workspaces.bias_gelu, workspaces.window_attention});
  if (backward > 0) arena_.add_workspace("workspace.backward", backward);

  const SwinParameterLayout layout(config, config.dtype);
  parameter_elements_ = layout.flat_elements();
  parameter_bytes_ = layout.flat_bytes();
}

size_t SwinMemoryPlan::trainer_bytes(bool master_weights) const {
  return adamw_trainer_bytes(parameter_bytes_, parameter_elements_, master_weights);
}

std::string SwinMemoryPlan::table() const {
  return "memory plan: " + config_.spec() + "\n" + arena_.table() +
         trainer_and_total_lines(arena_bytes(), parameter_bytes_, parameter_elements_);
}

}  // namespace fusekit::models
