#include "models/swin_parameters.h"

#include <algorithm>
#include <stdexcept>

namespace fusekit::models {

std::string swin_block_name(int stage, int block, std::string_view suffix) {
  return "layers." + std::to_string(stage) + ".blocks." + std::to_string(block) + "." + std::string(suffix);
}

bool swin_ignored_buffer(std::string_view name) {
  for (std::string_view buffer : {"relative_position_index", "relative_coords_table", "attn_mask"}) {
    if (name.find(buffer) != std::string_view::npos) return true;
  }
  return false;
}

SwinParameterLayout::SwinParameterLayout(const SwinConfig& config, kernels::DType storage)
    : storage_(storage), alignment_(16 / dtype_bytes(storage)) {
  SwinConfig checked = config;
  checked.dtype = kernels::DType::f16;  // the layout holds any storage type; validate the shape only
  validate(checked);
  const int64_t C = config.embed_dim, P = config.patch, table = (2LL * config.window - 1) * (2LL * config.window - 1);
  add("patch_embed.proj.weight", {C, config.in_channels, P, P}, true);
  add("patch_embed.proj.bias", {C}, false);
  add("patch_embed.norm.weight", {C}, false);
  add("patch_embed.norm.bias", {C}, false);
  for (int s = 0; s < config.stages(); ++s) {
    const int64_t D = config.stage_dim(s), hidden = D * config.mlp_ratio;
    const std::string stage = "layers." + std::to_string(s) + ".";
    if (s > 0) {
      add(stage + "downsample.norm.weight", {2 * D}, false);
      add(stage + "downsample.norm.bias", {2 * D}, false);
      add(stage + "downsample.reduction.weight", {D, 2 * D}, true);
    }
    for (int b = 0; b < config.depths[s]; ++b) {
      const auto name = [&](const char* suffix) { return swin_block_name(s, b, suffix); };
      add(name("norm1.weight"), {D}, false);
      add(name("norm1.bias"), {D}, false);
      add(name("attn.relative_position_bias_table"), {table, config.heads[s]}, false);
      add(name("attn.qkv.weight"), {3 * D, D}, true);
      add(name("attn.qkv.bias"), {3 * D}, false);
      add(name("attn.proj.weight"), {D, D}, true);
      add(name("attn.proj.bias"), {D}, false);
      add(name("norm2.weight"), {D}, false);
      add(name("norm2.bias"), {D}, false);
      add(name("mlp.fc1.weight"), {hidden, D}, true);
      add(name("mlp.fc1.bias"), {hidden}, false);
      add(name("mlp.fc2.weight"), {D, hidden}, true);
      add(name("mlp.fc2.bias"), {D}, false);
    }
  }
  const int64_t F = config.features();
  add("norm.weight", {F}, false);
  add("norm.bias", {F}, false);
  add("head.fc.weight", {config.classes, F}, true);
  add("head.fc.bias", {config.classes}, false);
  // timm's order above; the decaying parameters first, each group keeping it, then the offsets.
  std::stable_partition(parameters_.begin(), parameters_.end(), [](const SwinParameter& p) { return p.decays; });
  for (SwinParameter& p : parameters_) {
    p.offset = flat_elements_;
    flat_elements_ += (p.elements + alignment_ - 1) / alignment_ * alignment_;
    decayed_parameters_ += p.decays ? 1 : 0;
  }
}

void SwinParameterLayout::add(std::string name, std::vector<int64_t> shape, bool decays) {
  SwinParameter p;
  p.name = std::move(name);
  p.elements = 1;
  for (int64_t d : shape) p.elements *= static_cast<size_t>(d);
  p.shape = std::move(shape);
  p.decays = decays;
  parameters_.push_back(std::move(p));
}

size_t SwinParameterLayout::parameter_count() const {
  size_t count = 0;
  for (const SwinParameter& p : parameters_) count += p.elements;
  return count;
}

std::vector<size_t> SwinParameterLayout::parameter_sizes() const {
  std::vector<size_t> sizes;
  for (const SwinParameter& p : parameters_) sizes.push_back(p.elements);
  return sizes;
}

const SwinParameter* SwinParameterLayout::find(std::string_view name) const {
  for (const SwinParameter& p : parameters_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

size_t SwinParameterLayout::index(std::string_view name) const {
  const SwinParameter* p = find(name);
  if (!p) throw std::out_of_range("swin parameters: no parameter '" + std::string(name) + "'");
  return static_cast<size_t>(p - parameters_.data());
}

}  // namespace fusekit::models
