// Swin Transformer image classification (timm's swin_tiny_patch4_window7_224 and
// swin_base_patch4_window7_224): the model's configuration, its named presets and the string form
// the suites and the CLI use ("swin-t:b128:fp16"), as models/bert_config.h does for BERT.
//
// The model, as timm 1.x builds it (timm.models.swin_transformer.SwinTransformer): a patch
// embedding (a patch x patch convolution with stride patch to embed_dim channels, then LayerNorm),
// stages s = 0 .. stages()-1 of depths[s] blocks at width stage_dim(s) = embed_dim * 2^s on a
// stage_resolution(s)^2 grid, each stage after the first opening with a patch merging (2 x 2
// neighbours concatenated to 4 x the width, LayerNorm, a bias-free Linear to 2 x the width), a final
// LayerNorm, average pooling over the grid and the classifier. A block is pre-norm: LayerNorm,
// (shifted) window attention over window x window tokens with a relative position bias, residual;
// LayerNorm, MLP (mlp_ratio x the width, GELU), residual. Odd blocks shift the windows by window / 2,
// except where a stage's grid is no larger than the window (stage_shifts()), as timm does.
//
// Layer rule and the host library: as models/bert_config.h says (plain C++20, no CUDA).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "models/bert_config.h"  // dtype_spec_name, dtype_bytes

namespace fusekit::models {

struct SwinConfig {
  std::string name;  // the preset it came from: "swin-t", "swin-b", "swin-test"
  int image_size = 224;
  int in_channels = 3;
  int patch = 4;
  int window = 7;
  int embed_dim = 0;        // C: stage 0's width
  std::vector<int> depths;  // blocks per stage
  std::vector<int> heads;   // attention heads per stage
  int mlp_ratio = 4;
  int classes = 1000;
  double layer_norm_eps = 1e-5;  // torch.nn.LayerNorm's default, what timm uses throughout
  // The largest step shape: activations are planned for batch images.
  int batch = 1;
  kernels::DType dtype = kernels::DType::f16;

  int stages() const { return static_cast<int>(depths.size()); }
  int blocks() const;                     // the sum of depths
  int stage_dim(int stage) const;         // embed_dim * 2^stage
  int stage_resolution(int stage) const;  // (image_size / patch) / 2^stage: the grid's side
  int stage_head_dim(int stage) const;    // stage_dim / heads, 0 for a bad stage
  // Whether the odd blocks of this stage shift their windows: timm 1.x sets the shift to 0 (and the
  // window to the grid) where the grid is no larger than the window, e.g. Swin-T's last stage at 224.
  bool stage_shifts(int stage) const { return stage_resolution(stage) > window; }
  int features() const { return stages() > 0 ? stage_dim(stages() - 1) : 0; }  // the head's input width
  int window_tokens() const { return window * window; }
  long long tokens(int stage) const;  // batch x stage_resolution^2: the rows of a stage's activations
  // "swin-t:b128:fp16": parse_swin_config reads it back to an equal config (for presets).
  std::string spec() const;
};

// The presets, at 224 x 224, patch 4, window 7, MLP ratio 4, 1000 classes, batch 1, fp16:
//   "swin-t"     depths 2-2-6-2,  C 96,  heads 3-6-12-24 (timm's swin_tiny_patch4_window7_224)
//   "swin-b"     depths 2-2-18-2, C 128, heads 4-8-16-32 (timm's swin_base_patch4_window7_224)
//   "swin-test"  image 56, depths 2-2, C 32, heads 1-2, 10 classes: grids 14 and 7, so stage 0
//                shifts and stage 1 does not; for tests.
// head_dim is 32 in every stage of every preset. Throws std::invalid_argument naming the presets
// for any other name.
SwinConfig swin_preset(std::string_view name);
std::vector<std::string> swin_preset_names();

// "<preset>[:b<batch>][:fp16|bf16]", fields after the preset in any order, each at most once. The
// result is validated. Throws std::invalid_argument with one message per mistake.
SwinConfig parse_swin_config(std::string_view spec);

// The shift mask of timm's shifted windows (SwinTransformerBlock.get_attn_mask) for a stage of
// resolution x resolution tokens, `window` x `window` windows and a cyclic shift of `shift`: per window
// of one image (nW = (resolution / window)^2, in window_partition's order) and pair of its tokens
// (i, j), 0 where both tokens came from the same region of the shifted image and -100 otherwise:
// [nW, window^2, window^2], row-major, float (kernels/window_attention.h's mask).
std::vector<float> swin_shift_mask(int resolution, int window, int shift);

// Throws std::invalid_argument with one message for the first thing wrong: sizes < 1, no stages or
// heads not given per stage, image_size not a multiple of patch, a patch grid that does not halve
// down to the last stage, a stage grid that is not a multiple of the window (timm pads; the fused
// step does not), a window the window attention kernel lacks (kernels/window_attention.h: 7 or 12),
// a stage width not a multiple of its heads, a head_dim it lacks (32, 64), more than 64 heads, an MLP
// width that is not a multiple of 8 (the linear layer's GELU epilogue), eps <= 0, fp32 (the
// attention kernel is 16-bit only), or more tokens than an int holds.
void validate(const SwinConfig& config);

}  // namespace fusekit::models
