#include "models/bert_init.h"

#include <random>
#include <string>

#include "models/bert_checkpoint.h"
#include "models/bert_parameters.h"
#include "models/storage_conversion.h"

namespace fusekit::models {

BertInitialWeights::BertInitialWeights(const BertConfig& config, uint64_t seed, kernels::DType representable,
                                       float bias_std) {
  const BertParameterLayout layout(config, QkvLayout::separate, kernels::DType::f32);
  std::vector<float> values(layout.flat_elements(), 0.f);
  std::mt19937_64 random(seed);
  std::normal_distribution<float> weight(0.f, 0.02f), bias(0.f, bias_std > 0.f ? bias_std : 1.f);
  auto ends_with = [](const std::string& s, const char* suffix) {
    const std::string t(suffix);
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  for (const BertParameter& p : layout.parameters()) {
    const bool layernorm = p.name.find("LayerNorm") != std::string::npos;
    const bool is_bias = ends_with(p.name, ".bias");
    for (size_t i = 0; i < p.elements; ++i) {
      float v;
      if (layernorm) {
        v = is_bias ? 0.f : 1.f;
      } else if (is_bias) {
        v = bias_std > 0.f ? bias(random) : 0.f;
      } else {
        v = weight(random);
      }
      values[p.offset + i] = v;
    }
  }
  std::vector<std::byte> narrow(values.size() * dtype_bytes(representable));
  convert_storage(kernels::DType::f32, reinterpret_cast<const std::byte*>(values.data()), representable, narrow.data(),
                  values.size());
  flat_.resize(values.size() * sizeof(float));
  convert_storage(representable, narrow.data(), kernels::DType::f32, flat_.data(), values.size());
  views_ = bert_state_dict_views(layout, flat_, scratch_);
}

}  // namespace fusekit::models
