// timm Swin Transformer state dicts into SwinParameterLayout's flat buffer and back, as
// models/bert_checkpoint.h does for BERT.
//
// Loading maps each tensor of a timm SwinTransformer state dict (swin_tiny_patch4_window7_224 and
// the like) to its parameter by timm 1.x's name (models/swin_parameters.h), checks its shape,
// converts its type (F32, F16, BF16 into the layout's storage type, rounding to nearest even) and
// writes it at its offset in the flat buffer. The flat buffer's padding is zeroed. Names:
// - the buffers (swin_ignored_buffer(): attn.relative_position_index, attn_mask,
//   relative_coords_table) are skipped, whatever their type, and listed in the report's ignored;
// - older names, read the way timm 1.x's checkpoint_filter_fn renames them: a checkpoint without
//   head.fc.weight but with head.weight or a layers.0.downsample tensor (Microsoft's release, timm
//   before 0.9) has its patch merging one stage earlier (layers.<s>.downsample ->
//   layers.<s+1>.downsample) and its classifier as head.weight/.bias (-> head.fc.weight/.bias); each
//   alias used is one note in the report ("read layers.0.downsample.norm.weight as
//   layers.1.downsample.norm.weight");
// - any other tensor the model has no parameter for is ignored and listed;
// - two checkpoint tensors for one parameter (a new and an old name) are an error;
// - a missing parameter is an error (std::runtime_error) that lists every missing name; so is a
//   wrong shape or a type other than F32, F16, BF16, naming the tensor.
// Resizing (another window's relative position bias table, another patch size) is not done: timm's
// filter interpolates those, here they are shape errors.
//
// Saving writes the flat buffer as a timm 1.x state dict in safetensors form (the layout's storage
// type, the layout's order, no buffers), which timm's SwinTransformer.load_state_dict takes as is
// (its buffers are not persistent).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "models/bert_checkpoint.h"  // CheckpointLoadReport
#include "models/safetensors.h"
#include "models/swin_parameters.h"

namespace fusekit::models {

// Fills `flat` (layout.flat_bytes() bytes, layout.storage() elements) from the tensors. Throws
// std::invalid_argument for a flat buffer of another size, std::runtime_error as above.
CheckpointLoadReport load_swin_state_dict(const std::vector<TensorView>& tensors, const SwinParameterLayout& layout,
                                          std::span<std::byte> flat);

// The same from a .safetensors file; errors name the file.
CheckpointLoadReport load_swin_safetensors(const std::string& path, const SwinParameterLayout& layout,
                                           std::span<std::byte> flat);

// The flat buffer as timm 1.x tensors: views into `flat`, in the layout's order, its storage type.
std::vector<TensorView> swin_state_dict_views(const SwinParameterLayout& layout, std::span<const std::byte> flat);

// Writes the flat buffer to `path` as a timm 1.x state dict (see above).
void save_swin_safetensors(const std::string& path, const SwinParameterLayout& layout, std::span<const std::byte> flat);

}  // namespace fusekit::models
