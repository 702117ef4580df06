// Hugging Face BERT state dicts into fusekit's flat parameter layout and back.
//
// Loading maps each tensor of a BertForMaskedLM (or BertForPreTraining) state dict to its parameter
// in a BertParameterLayout, checks its shape, converts its type (F32, F16, BF16 into the layout's
// storage type, rounding to nearest even) and writes it at its offset in the flat buffer; in the
// packed layout the query, key and value tensors fill their row ranges of the layer's qkv tensor.
// The flat buffer's padding is zeroed. Names:
// - the older LayerNorm names (LayerNorm.gamma, LayerNorm.beta) are read as .weight and .bias;
// - cls.predictions.decoder.weight, the tied decoder, is checked, not loaded: its shape must be
//   word_embeddings' and its values equal to them after conversion (Hugging Face saves the tied
//   tensor twice in torch.save files, once or not at all in safetensors); a checkpoint whose decoder
//   differs from the word embeddings (untied) is an error, since this model ties them;
// - cls.predictions.decoder.bias is the same tensor as cls.predictions.bias: it stands in for it
//   when that is missing, and must equal it when both are present;
// - tensors the MLM model has no use for (bert.pooler.*, cls.seq_relationship.*, the buffer
//   bert.embeddings.position_ids, anything else) are ignored and listed in the report;
// - a missing parameter is an error (std::runtime_error) that lists every missing name; so is a
//   wrong shape or a type other than F32, F16, BF16.
// torch.save (pickle) files are not read here: convert them to safetensors first (safetensors'
// torch.save_file), which is how the Python peers hand weights over.
//
// Saving writes the flat buffer as a Hugging Face state dict in safetensors form (separate query,
// key and value tensors, the decoder weight left out as Hugging Face's own safetensors files do), so
// that every variant and the Python peers start from the same weights.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "models/bert_parameters.h"
#include "models/safetensors.h"

namespace fusekit::models {

struct CheckpointLoadReport {
  std::vector<std::string> loaded;   // parameters of the layout that were filled (layout names)
  std::vector<std::string> ignored;  // checkpoint tensors not used, with why: "bert.pooler.dense.weight (pooler)"
  std::vector<std::string> notes;    // aliases used, tied decoder checked, conversions
};

// Fills `flat` (layout.flat_bytes() bytes, layout.storage() elements) from the tensors.
CheckpointLoadReport load_bert_state_dict(const std::vector<TensorView>& tensors, const BertParameterLayout& layout,
                                          std::span<std::byte> flat);

// The same from a .safetensors file; errors name the file.
CheckpointLoadReport load_bert_safetensors(const std::string& path, const BertParameterLayout& layout,
                                           std::span<std::byte> flat);

// The flat buffer as Hugging Face tensors (views into `flat` for separate-layout parameters, into
// `scratch` for the unpacked query, key and value): names, shapes, the layout's storage type.
std::vector<TensorView> bert_state_dict_views(const BertParameterLayout& layout, std::span<const std::byte> flat,
                                              std::vector<std::byte>& scratch);

// Writes the flat buffer to `path` as a Hugging Face state dict (see above).
void save_bert_safetensors(const std::string& path, const BertParameterLayout& layout, std::span<const std::byte> flat);

}  // namespace fusekit::models
