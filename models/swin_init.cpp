#include "models/swin_init.h"

#include <cmath>
#include <random>
#include <string>

#include "models/storage_conversion.h"
#include "models/swin_checkpoint.h"
#include "models/swin_parameters.h"

namespace fusekit::models {

SwinInitialWeights::SwinInitialWeights(const SwinConfig& config, uint64_t seed, kernels::DType representable) {
  const SwinParameterLayout layout(config, kernels::DType::f32);
  std::vector<float> values(layout.flat_elements(), 0.f);
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  const auto truncated = [&] {  // timm's trunc_normal_(std=.02): bounds -2 and 2
    for (;;) {
      const float v = normal(random);
      if (v >= -2.f && v <= 2.f) return v;
    }
  };
  const float bound = 1.f / std::sqrt(static_cast<float>(config.in_channels * config.patch * config.patch));
  std::uniform_real_distribution<float> conv(-bound, bound);
  const auto ends_with = [](const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // Drawn in the layout's order (the decaying parameters first): the weights follow the seed and the layout.
  for (const SwinParameter& p : layout.parameters()) {
    const bool patch_conv = p.name.starts_with("patch_embed.proj.");
    const bool layernorm = p.name.find("norm") != std::string::npos && !patch_conv;
    for (size_t i = 0; i < p.elements; ++i) {
      float v;
      if (patch_conv) {
        v = conv(random);
      } else if (layernorm) {
        v = ends_with(p.name, ".weight") ? 1.f : 0.f;
      } else if (ends_with(p.name, ".bias")) {
        v = 0.f;
      } else {
        v = truncated();  // Linear weights and relative_position_bias_table
      }
      values[p.offset + i] = v;
    }
  }
  std::vector<std::byte> narrow(values.size() * dtype_bytes(representable));
  convert_storage(kernels::DType::f32, reinterpret_cast<const std::byte*>(values.data()), representable, narrow.data(),
                  values.size());
  flat_.resize(values.size() * sizeof(float));
  convert_storage(representable, narrow.data(), kernels::DType::f32, flat_.data(), values.size());
  views_ = swin_state_dict_views(layout, flat_);
}

}  // namespace fusekit::models
