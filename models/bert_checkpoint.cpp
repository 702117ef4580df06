#include "models/bert_checkpoint.h"

#include <cstring>
#include <map>
#include <stdexcept>

#include "models/storage_conversion.h"

namespace fusekit::models {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Where a Hugging Face tensor goes: a parameter of the layout, and for the packed layout the
// element range inside it.
struct Destination {
  size_t parameter;
  size_t first_element;  // into the parameter
  std::vector<int64_t> shape;
};

// The layout's destination for every Hugging Face name it loads.
std::map<std::string, Destination> destinations(const BertParameterLayout& layout) {
  std::map<std::string, Destination> map;
  const auto& params = layout.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const BertParameter& p = params[i];
    const size_t packed = p.name.find("attention.self.qkv.");
    if (packed == std::string::npos) {
      map[p.name] = {i, 0, p.shape};
      continue;
    }
    // Packed: query, key, value each own a third of the rows (models/bert_parameters.h).
    const bool bias = ends_with(p.name, ".bias");
    const std::string prefix = p.name.substr(0, packed) + "attention.self.";
    const int64_t hidden = p.shape[0] / 3;
    const size_t row_elements = bias ? 1 : static_cast<size_t>(p.shape[1]);
    const char* which[3] = {"query", "key", "value"};
    for (int w = 0; w < 3; ++w) {
      std::vector<int64_t> shape = bias ? std::vector<int64_t>{hidden} : std::vector<int64_t>{hidden, p.shape[1]};
      map[prefix + which[w] + (bias ? ".bias" : ".weight")] = {i, w * static_cast<size_t>(hidden) * row_elements,
                                                               std::move(shape)};
    }
  }
  return map;
}

// Hugging Face's older LayerNorm names, read as the current ones.
std::string canonical_name(const std::string& name) {
  if (ends_with(name, "LayerNorm.gamma")) return name.substr(0, name.size() - 5) + "weight";
  if (ends_with(name, "LayerNorm.beta")) return name.substr(0, name.size() - 4) + "bias";
  return name;
}

std::string ignored_reason(const std::string& name) {
  if (starts_with(name, "bert.pooler.")) return "pooler: not part of the MLM model";
  if (starts_with(name, "cls.seq_relationship.")) return "next-sentence head: not part of the MLM model";
  if (name == "bert.embeddings.position_ids") return "buffer: positions are 0..sequence-1";
  return "not a parameter of BERT MLM";
}

// The tensor converted to the layout's storage type.
std::vector<std::byte> converted(const TensorView& t, kernels::DType storage) {
  const std::optional<kernels::DType> from = storage_type(t.type);
  if (!from) {
    throw std::runtime_error("bert checkpoint: tensor '" + t.name + "' has dtype " + tensor_type_name(t.type) +
                             " (expected F32, F16 or BF16)");
  }
  std::vector<std::byte> out(t.elements() * dtype_bytes(storage));
  convert_storage(*from, t.bytes.data(), storage, out.data(), t.elements());
  return out;
}

}  // namespace

CheckpointLoadReport load_bert_state_dict(const std::vector<TensorView>& tensors, const BertParameterLayout& layout,
                                          std::span<std::byte> flat) {
  if (flat.size() != layout.flat_bytes()) {
    throw std::invalid_argument("bert checkpoint: flat buffer of " + std::to_string(flat.size()) +
                                " bytes, the layout needs " + std::to_string(layout.flat_bytes()));
  }
  const size_t element = dtype_bytes(layout.storage());
  std::memset(flat.data(), 0, flat.size());
  CheckpointLoadReport report;
  const std::map<std::string, Destination> targets = destinations(layout);
  std::map<std::string, bool> filled;
  const TensorView* decoder_weight = nullptr;
  const TensorView* decoder_bias = nullptr;
  std::map<std::string, std::string> seen;  // canonical name -> the name in the checkpoint

  for (const TensorView& t : tensors) {
    const std::string name = canonical_name(t.name);
    if (name != t.name) report.notes.push_back("read " + t.name + " as " + name);
    if (auto [it, fresh] = seen.emplace(name, t.name); !fresh) {
      throw std::runtime_error("bert checkpoint: '" + t.name + "' and '" + it->second + "' are the same parameter");
    }
    if (name == "cls.predictions.decoder.weight") {
      decoder_weight = &t;
      continue;
    }
    if (name == "cls.predictions.decoder.bias") {
      decoder_bias = &t;
      continue;
    }
    const auto target = targets.find(name);
    if (target == targets.end()) {
      report.ignored.push_back(t.name + " (" + ignored_reason(name) + ")");
      continue;
    }
    const Destination& d = target->second;
    if (t.shape != d.shape) {
      throw std::runtime_error("bert checkpoint: tensor '" + t.name + "' has shape " + shape_text(t.shape) +
                               ", the model needs " + shape_text(d.shape));
    }
    const std::vector<std::byte> bytes = converted(t, layout.storage());
    const BertParameter& p = layout.parameters()[d.parameter];
    std::memcpy(flat.data() + (p.offset + d.first_element) * element, bytes.data(), bytes.size());
    filled[name] = true;
    report.loaded.push_back(name);
  }

  // The decoder bias is cls.predictions.bias under another name.
  if (decoder_bias) {
    const Destination& d = targets.at("cls.predictions.bias");
    if (decoder_bias->shape != d.shape) {
      throw std::runtime_error("bert checkpoint: tensor '" + decoder_bias->name + "' has shape " +
                               shape_text(decoder_bias->shape) + ", the model needs " + shape_text(d.shape));
    }
    const std::vector<std::byte> bytes = converted(*decoder_bias, layout.storage());
    std::byte* at = flat.data() + layout.parameters()[d.parameter].offset * element;
    if (filled.count("cls.predictions.bias")) {
      if (std::memcmp(at, bytes.data(), bytes.size()) != 0) {
        throw std::runtime_error(
            "bert checkpoint: cls.predictions.decoder.bias differs from cls.predictions.bias (they are one tensor)");
      }
      report.notes.push_back("cls.predictions.decoder.bias equals cls.predictions.bias (tied)");
    } else {
      std::memcpy(at, bytes.data(), bytes.size());
      filled["cls.predictions.bias"] = true;
      report.loaded.push_back("cls.predictions.bias");
      report.notes.push_back("cls.predictions.bias read from cls.predictions.decoder.bias");
    }
  }

  std::string missing;
  for (const auto& [name, target] : targets) {
    if (!filled.count(name)) missing += (missing.empty() ? "" : ", ") + name;
  }
  if (!missing.empty()) throw std::runtime_error("bert checkpoint: missing tensors: " + missing);

  // The tied decoder: checked against the word embeddings as loaded.
  if (decoder_weight) {
    const char* word = "bert.embeddings.word_embeddings.weight";
    const Destination& d = targets.at(word);
    if (decoder_weight->shape != d.shape) {
      throw std::runtime_error("bert checkpoint: tensor '" + decoder_weight->name + "' has shape " +
                               shape_text(decoder_weight->shape) + ", the model needs " + shape_text(d.shape));
    }
    const std::vector<std::byte> bytes = converted(*decoder_weight, layout.storage());
    if (std::memcmp(flat.data() + layout.parameters()[d.parameter].offset * element, bytes.data(), bytes.size()) != 0) {
      throw std::runtime_error(
          "bert checkpoint: cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight: an "
          "untied decoder, which this model does not have");
    }
    report.notes.push_back("cls.predictions.decoder.weight equals the word embeddings (tied): not loaded twice");
  }
  return report;
}

CheckpointLoadReport load_bert_safetensors(const std::string& path, const BertParameterLayout& layout,
                                           std::span<std::byte> flat) {
  const SafetensorsFile file = SafetensorsFile::read(path);
  try {
    return load_bert_state_dict(file.tensors(), layout, flat);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

std::vector<TensorView> bert_state_dict_views(const BertParameterLayout& layout, std::span<const std::byte> flat,
                                              std::vector<std::byte>& scratch) {
  if (flat.size() != layout.flat_bytes()) {
    throw std::invalid_argument("bert checkpoint: flat buffer of " + std::to_string(flat.size()) +
                                " bytes, the layout needs " + std::to_string(layout.flat_bytes()));
  }
  const size_t element = dtype_bytes(layout.storage());
  const TensorType type = tensor_type(layout.storage());
  const std::map<std::string, Destination> targets = destinations(layout);
  // The unpacked views point into `scratch`, sized once so that it never moves.
  size_t scratch_bytes = 0;
  for (const auto& [name, d] : targets) {
    if (layout.parameters()[d.parameter].name != name) {
      scratch_bytes += layout.parameters()[d.parameter].elements / 3 * element;
    }
  }
  scratch.assign(scratch_bytes, std::byte{0});
  size_t used = 0;
  std::vector<TensorView> views;
  // In the layout's order (query, key, value in that order within a packed tensor).
  for (size_t i = 0; i < layout.parameters().size(); ++i) {
    const BertParameter& p = layout.parameters()[i];
    const std::byte* base = flat.data() + p.offset * element;
    if (p.name.find("attention.self.qkv.") == std::string::npos) {
      views.push_back({p.name, type, p.shape, std::span<const std::byte>(base, p.elements * element)});
      continue;
    }
    const bool bias = ends_with(p.name, ".bias");
    const std::string prefix = p.name.substr(0, p.name.find("qkv."));
    for (const char* which : {"query", "key", "value"}) {
      const std::string name = prefix + which + (bias ? ".bias" : ".weight");
      const Destination& d = targets.at(name);
      const size_t bytes = p.elements / 3 * element;
      std::memcpy(scratch.data() + used, base + d.first_element * element, bytes);
      views.push_back({name, type, d.shape, std::span<const std::byte>(scratch.data() + used, bytes)});
      used += bytes;
    }
  }
  return views;
}

void save_bert_safetensors(const std::string& path, const BertParameterLayout& layout,
                           std::span<const std::byte> flat) {
  std::vector<std::byte> scratch;
  write_safetensors(path, bert_state_dict_views(layout, flat, scratch), {{"format", "pt"}});
}

}  // namespace fusekit::models
