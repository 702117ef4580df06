// The device memory of a fused Swin classification training step, planned once for the config's
// batch, as models/memory_plan.h plans BERT's: every buffer at an aligned offset in one arena.
//
// The step this plans (per block of a stage with T tokens of width D, W = T / N windows of N tokens):
//   windows = window_partition(x; norm1)      LayerNorm + cyclic shift + partition (kernels/swin_window.h)
//   qkv     = windows Wqkv^T + bqkv            [T, 3D]
//   out     = window_attention(qkv, table)     bias + shift mask + softmax + P V (kernels/window_attention.h)
//   x1      = window_merge(out Wproj^T + bproj, x)   reverse + reverse shift + residual
//   up      = norm2(x1) W1^T, g = gelu(up + b1)     (kernels/bias_gelu.h recomputes up + b1)
//   x2      = x1 + g W2^T + b2                 the block's output, the next block's x
// preceded by the patch embedding (the 4x4 stride-4 convolution as a GEMM over the image's patches,
// then timm's patch_embed.norm) and, at the start of each stage after the first, patch merging
// (2x2 gather + LayerNorm over 4 x the previous width, kernels/swin_window.h, then the reduction
// GEMM), and followed by the final LayerNorm, the average over each image's tokens, the head and
// cross-entropy with label smoothing.
//
// Saved by the forward for the backward, per block: norm1's mean and rstd (the partition backward
// recomputes the normalized tokens from x, the previous block's output), windows (the qkv GEMM's
// input), qkv, the attention output, its lse [W, heads, N] and the gathered bias [heads, N, N] (float),
// x1, norm2's output and statistics, up and g, and x2. Shared scratch: the projection's and fc2's
// outputs before the residual adds. Gradients of activations are scratch shared by all blocks (the
// backward walks them one at a time), sized for the largest stage.
//
// Not in the arena, as for BERT: parameters, their gradients and the AdamW state (the trainer's),
// and cuBLASLt's workspace; trainer_bytes() counts the trainer's for the report.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "models/memory_plan.h"
#include "models/swin_config.h"

namespace fusekit::models {

// Bytes of the kernels' backward workspaces, from their *_workspace_bytes functions for the
// plan's largest shapes (device-dependent; the GPU step fills them in). Zero leaves one out.
struct SwinKernelWorkspaces {
  size_t layernorm = 0;         // layernorm_backward_workspace_bytes(T, D), the largest stage
  size_t window_partition = 0;  // window_partition_backward_workspace_bytes
  size_t patch_merging = 0;     // patch_merging_backward_workspace_bytes
  size_t bias_gelu = 0;         // bias_gelu_backward_workspace_bytes(T, 4D)
  size_t window_attention = 0;  // window_attention_backward_workspace_bytes
};

class SwinMemoryPlan {
 public:
  // Validates the config (models/swin_config.h validate()).
  explicit SwinMemoryPlan(const SwinConfig& config, const SwinKernelWorkspaces& workspaces = {});

  const SwinConfig& config() const { return config_; }
  const std::vector<PlannedBuffer>& buffers() const { return arena_.buffers(); }
  const PlannedBuffer& buffer(std::string_view name) const { return arena_.buffer(name); }
  size_t arena_bytes() const { return arena_.arena_bytes(); }
  size_t bytes_of(BufferKind kind) const { return arena_.bytes_of(kind); }
  size_t parameter_bytes() const { return parameter_bytes_; }
  size_t trainer_bytes(bool master_weights) const;
  size_t total_bytes(bool master_weights) const { return arena_bytes() + trainer_bytes(master_weights); }
  std::string table() const;

  // "stage.<s>.block.<b>.<what>", the names of a block's buffers.
  static std::string block_buffer(int stage, int block, std::string_view what);
  // Global block index of (stage, block), as PlannedBuffer::layer holds it.
  int block_index(int stage, int block) const;

 private:
  SwinConfig config_;
  BufferArena arena_;
  size_t parameter_bytes_ = 0;
  size_t parameter_elements_ = 0;
};

}  // namespace fusekit::models
