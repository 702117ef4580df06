// The parameters of Swin classification (timm 1.x's timm.models.swin_transformer.SwinTransformer,
// e.g. swin_tiny_patch4_window7_224), in timm's names and shapes, and their flat layout: every
// parameter's offset in one flat buffer, as models/bert_parameters.h has it for BERT.
//
// timm's order (the state dict's):
//   patch_embed.proj.weight [C, in_channels, patch, patch], .bias [C]  (a Conv2d, stride patch)
//   patch_embed.norm.weight [C], .bias [C]
//   per stage s, width D = C * 2^s:
//     s >= 1: layers.<s>.downsample.norm.weight [2D], .bias [2D]  (the previous width times 4)
//             layers.<s>.downsample.reduction.weight [D, 2D]       (no bias)
//     per block b: layers.<s>.blocks.<b>.
//       norm1.weight/.bias [D]
//       attn.relative_position_bias_table [(2 window - 1)^2, heads]
//       attn.qkv.weight [3D, D], .bias [3D]  (rows: query, key, value; each heads x head_dim)
//       attn.proj.weight [D, D], .bias [D]
//       norm2.weight/.bias [D]
//       mlp.fc1.weight [4D, D], .bias [4D]
//       mlp.fc2.weight [D, 4D], .bias [D]
//   norm.weight/.bias [F], F = C * 2^(stages - 1)
//   head.fc.weight [classes, F], .bias [classes]
// The patch merging sits at the START of stages 1 .. stages-1, as layers.<s>.downsample with s >= 1:
// that is timm 1.x (SwinTransformerStage). Microsoft's release and timm before 0.9 put it at the end
// of stages 0 .. stages-2 and named the classifier head.weight; timm 1.x's checkpoint_filter_fn
// renames such a checkpoint (layers.<s>.downsample -> layers.<s+1>.downsample, head. -> head.fc.).
// qkv is one packed tensor in timm already: no separate layout as BERT has.
//
// Buffers are not parameters: attn.relative_position_index (int, [N, N]) in every block and
// attn_mask (the shift mask) in the shifting ones. timm 1.x does not save them (persistent=False),
// older checkpoints do; swin_ignored_buffer() tells a checkpoint loader to skip them.
// (relative_position_index is what kernels/window_attention.h's relative_position_index() computes.)
//
// The flat layout: as BertParameterLayout's (tensors end to end, each on a 16-byte boundary, the
// decaying ones first, each group in timm's order, so AdamWTrainer decays a prefix). What decays:
// the Linear and Conv2d weights (patch_embed.proj, qkv, proj, fc1, fc2, downsample.reduction,
// head.fc). What does not: biases, LayerNorms and the relative position bias tables, as timm's
// optimizer factory has it (param_groups_weight_decay leaves out every 1-d tensor and bias, and
// SwinTransformer.no_weight_decay() names relative_position_bias_table).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "models/bert_parameters.h"  // BertParameter: name, shape, elements, offset, decays
#include "models/swin_config.h"

namespace fusekit::models {

using SwinParameter = BertParameter;  // the name is timm's here

class SwinParameterLayout {
 public:
  // Throws std::invalid_argument for a config that validate() rejects (dtype aside: the layout takes
  // the storage type of the flat buffer, f32 included, for tests and the fp32 master copy).
  SwinParameterLayout(const SwinConfig& config, kernels::DType storage);

  const std::vector<SwinParameter>& parameters() const { return parameters_; }
  kernels::DType storage() const { return storage_; }
  size_t alignment_elements() const { return alignment_; }
  size_t flat_elements() const { return flat_elements_; }  // padding included
  size_t flat_bytes() const { return flat_elements_ * dtype_bytes(storage_); }
  // The number of trainable parameters (no padding): 28,288,354 for Swin-T, 87,768,224 for Swin-B.
  size_t parameter_count() const;
  std::vector<size_t> parameter_sizes() const;  // elements per parameter, in order (AdamWTrainer's sizes)
  // parameters()[i].decays is true exactly for i < decayed_parameters(). AdamWTrainer's decayed_tensors.
  size_t decayed_parameters() const { return decayed_parameters_; }

  const SwinParameter* find(std::string_view name) const;  // or null
  size_t index(std::string_view name) const;               // throws std::out_of_range for an unknown name

 private:
  void add(std::string name, std::vector<int64_t> shape, bool decays);

  kernels::DType storage_;
  size_t alignment_;
  std::vector<SwinParameter> parameters_;
  size_t decayed_parameters_ = 0;
  size_t flat_elements_ = 0;
};

// "layers.<stage>.blocks.<block>.<suffix>"
std::string swin_block_name(int stage, int block, std::string_view suffix);

// Whether a state dict entry of this name is one of timm's buffers (relative_position_index,
// relative_coords_table, attn_mask), which a loader skips: timm's checkpoint_filter_fn's list.
bool swin_ignored_buffer(std::string_view name);

}  // namespace fusekit::models
