#include "models/swin_checkpoint.h"

#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <stdexcept>

#include "models/storage_conversion.h"

namespace fusekit::models {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Whether the checkpoint uses the older names, as timm's checkpoint_filter_fn decides it (no
// head.fc.weight), and only where an older name is actually there (so that a timm 1.x checkpoint
// missing head.fc.weight reports that, not renamed patch mergings).
bool older_names(const std::vector<TensorView>& tensors) {
  bool new_head = false, old_name = false;
  for (const TensorView& t : tensors) {
    if (t.name == "head.fc.weight") new_head = true;
    if (t.name == "head.weight" || t.name == "head.bias" || starts_with(t.name, "layers.0.downsample.")) {
      old_name = true;
    }
  }
  return old_name && !new_head;
}

// The timm 1.x name of an older one: layers.<s>.downsample -> layers.<s+1>.downsample, head. ->
// head.fc. (checkpoint_filter_fn's two renames).
std::string renamed(const std::string& name) {
  static const std::regex downsample(R"(^layers\.(\d+)\.downsample\.)");
  std::smatch m;
  if (std::regex_search(name, m, downsample)) {
    return "layers." + std::to_string(std::stoi(m[1].str()) + 1) + ".downsample." + m.suffix().str();
  }
  if (starts_with(name, "head.") && !starts_with(name, "head.fc.")) return "head.fc." + name.substr(5);
  return name;
}

// The tensor converted to the layout's storage type.
std::vector<std::byte> converted(const TensorView& t, kernels::DType storage) {
  const std::optional<kernels::DType> from = storage_type(t.type);
  if (!from) {
    throw std::runtime_error("swin checkpoint: tensor '" + t.name + "' has dtype " + tensor_type_name(t.type) +
                             " (expected F32, F16 or BF16)");
  }
  std::vector<std::byte> out(t.elements() * dtype_bytes(storage));
  convert_storage(*from, t.bytes.data(), storage, out.data(), t.elements());
  return out;
}

void check_size(const SwinParameterLayout& layout, size_t bytes) {
  if (bytes != layout.flat_bytes()) {
    throw std::invalid_argument("swin checkpoint: flat buffer of " + std::to_string(bytes) +
                                " bytes, the layout needs " + std::to_string(layout.flat_bytes()));
  }
}

}  // namespace

CheckpointLoadReport load_swin_state_dict(const std::vector<TensorView>& tensors, const SwinParameterLayout& layout,
                                          std::span<std::byte> flat) {
  check_size(layout, flat.size());
  const size_t element = dtype_bytes(layout.storage());
  std::memset(flat.data(), 0, flat.size());
  CheckpointLoadReport report;
  const bool older = older_names(tensors);
  if (older) {
    report.notes.push_back(
        "older names (no head.fc.weight): patch merging one stage earlier and head.weight/.bias, renamed as timm's "
        "checkpoint_filter_fn does");
  }
  std::map<std::string, std::string> seen;  // timm 1.x name -> the name in the checkpoint
  for (const TensorView& t : tensors) {
    if (swin_ignored_buffer(t.name)) {
      report.ignored.push_back(t.name + " (buffer: computed from the config, not a parameter)");
      continue;
    }
    const std::string name = older ? renamed(t.name) : t.name;
    const SwinParameter* p = layout.find(name);
    if (!p) {
      report.ignored.push_back(t.name + " (not a parameter of Swin" + (name != t.name ? ", read as " + name : "") +
                               ")");
      continue;
    }
    if (name != t.name) report.notes.push_back("read " + t.name + " as " + name);
    if (auto [it, fresh] = seen.emplace(name, t.name); !fresh) {
      throw std::runtime_error("swin checkpoint: '" + t.name + "' and '" + it->second + "' are the same parameter (" +
                               name + ")");
    }
    if (t.shape != p->shape) {
      throw std::runtime_error("swin checkpoint: tensor '" + t.name + "' has shape " + shape_text(t.shape) +
                               ", the model needs " + shape_text(p->shape));
    }
    const std::vector<std::byte> bytes = converted(t, layout.storage());
    std::memcpy(flat.data() + p->offset * element, bytes.data(), bytes.size());
    report.loaded.push_back(name);
  }
  std::string missing;
  for (const SwinParameter& p : layout.parameters()) {
    if (!seen.count(p.name)) missing += (missing.empty() ? "" : ", ") + p.name;
  }
  if (!missing.empty()) throw std::runtime_error("swin checkpoint: missing tensors: " + missing);
  return report;
}

CheckpointLoadReport load_swin_safetensors(const std::string& path, const SwinParameterLayout& layout,
                                           std::span<std::byte> flat) {
  const SafetensorsFile file = SafetensorsFile::read(path);
  try {
    return load_swin_state_dict(file.tensors(), layout, flat);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

std::vector<TensorView> swin_state_dict_views(const SwinParameterLayout& layout, std::span<const std::byte> flat) {
  check_size(layout, flat.size());
  const size_t element = dtype_bytes(layout.storage());
  const TensorType type = tensor_type(layout.storage());
  std::vector<TensorView> views;
  for (const SwinParameter& p : layout.parameters()) {
    views.push_back({p.name, type, p.shape, flat.subspan(p.offset * element, p.elements * element)});
  }
  return views;
}

void save_swin_safetensors(const std::string& path, const SwinParameterLayout& layout,
                           std::span<const std::byte> flat) {
  write_safetensors(path, swin_state_dict_views(layout, flat), {{"format", "pt"}});
}

}  // namespace fusekit::models
