#include "models/bert_parameters.h"

#include <algorithm>
#include <stdexcept>

namespace fusekit::models {

std::string bert_layer_name(int layer, std::string_view suffix) {
  return "bert.encoder.layer." + std::to_string(layer) + "." + std::string(suffix);
}

BertParameterLayout::BertParameterLayout(const BertConfig& config, QkvLayout qkv, kernels::DType storage)
    : qkv_(qkv), storage_(storage), alignment_(16 / dtype_bytes(storage)), hidden_(config.hidden) {
  BertConfig checked = config;
  checked.dtype = kernels::DType::f16;  // the layout holds any storage type; validate the shape only
  validate(checked);
  const int64_t H = config.hidden, I = config.intermediate, V = config.vocab;
  add("bert.embeddings.word_embeddings.weight", {V, H}, true);
  add("bert.embeddings.position_embeddings.weight", {config.max_positions, H}, true);
  add("bert.embeddings.token_type_embeddings.weight", {config.token_types, H}, true);
  add("bert.embeddings.LayerNorm.weight", {H}, false);
  add("bert.embeddings.LayerNorm.bias", {H}, false);
  for (int l = 0; l < config.layers; ++l) {
    if (qkv == QkvLayout::packed) {
      add(bert_layer_name(l, "attention.self.qkv.weight"), {3 * H, H}, true);
      add(bert_layer_name(l, "attention.self.qkv.bias"), {3 * H}, false);
    } else {
      for (const char* p : {"query", "key", "value"}) {
        add(bert_layer_name(l, std::string("attention.self.") + p + ".weight"), {H, H}, true);
        add(bert_layer_name(l, std::string("attention.self.") + p + ".bias"), {H}, false);
      }
    }
    add(bert_layer_name(l, "attention.output.dense.weight"), {H, H}, true);
    add(bert_layer_name(l, "attention.output.dense.bias"), {H}, false);
    add(bert_layer_name(l, "attention.output.LayerNorm.weight"), {H}, false);
    add(bert_layer_name(l, "attention.output.LayerNorm.bias"), {H}, false);
    add(bert_layer_name(l, "intermediate.dense.weight"), {I, H}, true);
    add(bert_layer_name(l, "intermediate.dense.bias"), {I}, false);
    add(bert_layer_name(l, "output.dense.weight"), {H, I}, true);
    add(bert_layer_name(l, "output.dense.bias"), {H}, false);
    add(bert_layer_name(l, "output.LayerNorm.weight"), {H}, false);
    add(bert_layer_name(l, "output.LayerNorm.bias"), {H}, false);
  }
  add("cls.predictions.transform.dense.weight", {H, H}, true);
  add("cls.predictions.transform.dense.bias", {H}, false);
  add("cls.predictions.transform.LayerNorm.weight", {H}, false);
  add("cls.predictions.transform.LayerNorm.bias", {H}, false);
  add("cls.predictions.bias", {V}, false);
  // Hugging Face's order above; the decaying parameters first, each group keeping it, then the offsets.
  std::stable_partition(parameters_.begin(), parameters_.end(), [](const BertParameter& p) { return p.decays; });
  for (BertParameter& p : parameters_) {
    p.offset = flat_elements_;
    flat_elements_ += (p.elements + alignment_ - 1) / alignment_ * alignment_;
    decayed_parameters_ += p.decays ? 1 : 0;
  }
}

void BertParameterLayout::add(std::string name, std::vector<int64_t> shape, bool decays) {
  BertParameter p;
  p.name = std::move(name);
  p.elements = 1;
  for (int64_t d : shape) p.elements *= static_cast<size_t>(d);
  p.shape = std::move(shape);
  p.decays = decays;
  parameters_.push_back(std::move(p));
}

size_t BertParameterLayout::parameter_count() const {
  size_t count = 0;
  for (const BertParameter& p : parameters_) count += p.elements;
  return count;
}

std::vector<size_t> BertParameterLayout::parameter_sizes() const {
  std::vector<size_t> sizes;
  for (const BertParameter& p : parameters_) sizes.push_back(p.elements);
  return sizes;
}

const BertParameter* BertParameterLayout::find(std::string_view name) const {
  for (const BertParameter& p : parameters_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

size_t BertParameterLayout::index(std::string_view name) const {
  const BertParameter* p = find(name);
  if (!p) throw std::out_of_range("bert parameters: no parameter '" + std::string(name) + "'");
  return static_cast<size_t>(p - parameters_.data());
}

QkvRows BertParameterLayout::qkv_rows(int layer, int which, bool bias) const {
  if (qkv_ != QkvLayout::packed) throw std::logic_error("bert parameters: qkv_rows needs the packed layout");
  if (which < 0 || which > 2) throw std::out_of_range("bert parameters: qkv_rows: which is 0, 1 or 2");
  QkvRows rows;
  rows.parameter = index(bert_layer_name(layer, bias ? "attention.self.qkv.bias" : "attention.self.qkv.weight"));
  rows.first_row = static_cast<size_t>(which) * hidden_;
  rows.rows = hidden_;
  return rows;
}

}  // namespace fusekit::models
