// The parameters of BERT for masked-LM pre-training (Hugging Face's BertForMaskedLM), in Hugging
// Face's names and shapes, and their flat layout: every parameter's offset in one flat buffer.
//
// The flat layout is the one kernels/adamw.h's AdamWTrainer builds from the same sizes: tensors end
// to end in this list's order, each starting on a 16-byte boundary (a multiple of 16 / element size
// elements; the padding is zeros), so vectorized kernels read every tensor with 16-byte loads and
// the trainer updates all of them in one pass. parameter_sizes() gives the trainer its sizes.
//
// The order: every parameter that takes weight decay (BertParameter::decays: the Linear weights and
// the three embedding tables) first, then every one that does not (biases and LayerNorm weights and
// biases, BERT's recipe), each group in Hugging Face's order (embeddings, layers 0 .. L-1, head).
// So the decaying parameters are one prefix of the flat buffer, which is what the trainer's weight
// decay takes: AdamWTrainer(dtype, parameter_sizes(), master, decayed_parameters()).
//
// Two orders of the query, key and value projections:
// - QkvLayout::separate: Hugging Face's own tensors (attention.self.query/key/value.{weight,bias}),
//   the libtorch baseline's layout and the one a state dict is saved in.
// - QkvLayout::packed: the fused variant's. Per layer one weight
//   bert.encoder.layer.N.attention.self.qkv.weight [3H, H] and one bias ...qkv.bias [3H]: rows
//   [0, H) are the query's, [H, 2H) the key's, [2H, 3H) the value's (qkv_rows()), which is
//   kernels/linear.h's pack_qkv_projection: the projection then writes [tokens, 3, heads, head_dim],
//   what kernels/bert_attention.h reads.
//
// The MLM decoder (cls.predictions.decoder.weight, [vocab, H]) is tied to the word embeddings, as in
// Hugging Face: it is not a parameter of its own here, the decoder reads
// bert.embeddings.word_embeddings.weight and its gradient adds into that tensor's. Its bias is
// cls.predictions.bias ([vocab]; Hugging Face's cls.predictions.decoder.bias is the same tensor).
// Loading a checkpoint that holds the decoder weight: see models/bert_checkpoint.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "models/bert_config.h"

namespace fusekit::models {

enum class QkvLayout { separate, packed };

struct BertParameter {
  std::string name;            // Hugging Face's name (or the packed qkv tensor's, see above)
  std::vector<int64_t> shape;  // as torch.nn holds it: Linear weights [out, in]
  size_t elements = 0;         // product of shape
  size_t offset = 0;           // elements into the flat buffer, a multiple of the alignment
  bool decays = true;          // AdamW weight decay applies: false for biases and LayerNorm (BERT's recipe)
};

// Where a Hugging Face query, key or value tensor goes in the packed layout.
struct QkvRows {
  size_t parameter = 0;  // index of the packed weight or bias in parameters()
  size_t first_row = 0;  // its rows [first_row, first_row + rows) (a bias: its elements)
  size_t rows = 0;
};

class BertParameterLayout {
 public:
  // Throws std::invalid_argument for a config that validate() rejects (dtype aside: the layout takes
  // the storage type of the flat buffer, f32 included, for tests and the fp32 master copy).
  BertParameterLayout(const BertConfig& config, QkvLayout qkv, kernels::DType storage);

  const std::vector<BertParameter>& parameters() const { return parameters_; }
  QkvLayout qkv_layout() const { return qkv_; }
  kernels::DType storage() const { return storage_; }
  size_t alignment_elements() const { return alignment_; }
  // Elements of the flat buffer, padding included.
  size_t flat_elements() const { return flat_elements_; }
  size_t flat_bytes() const { return flat_elements_ * dtype_bytes(storage_); }
  // The number of trainable parameters (no padding): 109,514,298 for BERT-base.
  size_t parameter_count() const;
  std::vector<size_t> parameter_sizes() const;  // elements per parameter, in order (AdamWTrainer's sizes)
  // The parameters that decay, all before any that does not (see above): parameters()[i].decays is
  // true exactly for i < decayed_parameters(). AdamWTrainer's decayed_tensors.
  size_t decayed_parameters() const { return decayed_parameters_; }

  // The parameter of this name, or null.
  const BertParameter* find(std::string_view name) const;
  size_t index(std::string_view name) const;  // throws std::out_of_range for an unknown name
  // Packed layout only: where query (0), key (1) or value (2) of `layer` sits; weight or bias.
  QkvRows qkv_rows(int layer, int which, bool bias) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, bool decays);

  QkvLayout qkv_;
  kernels::DType storage_;
  size_t alignment_;
  int hidden_;
  std::vector<BertParameter> parameters_;
  size_t decayed_parameters_ = 0;
  size_t flat_elements_ = 0;
};

// "bert.encoder.layer.<layer>.<suffix>"
std::string bert_layer_name(int layer, std::string_view suffix);

}  // namespace fusekit::models
