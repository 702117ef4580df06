// Random BERT weights as a Hugging Face state dict, the same for every variant: matrices and
// embedding tables normal(0, 0.02) (BERT's initializer_range), LayerNorm weights 1 and biases 0,
// the other biases normal(0, bias_std) (0: zero, as Hugging Face initializes them; tests pass a
// small value so that the biases' paths are exercised). Every value is rounded through
// `representable` (fp16 or bf16), so that a variant storing its parameters in that type starts from
// exactly the weights an fp32 variant starts from. Deterministic in the seed (std::mt19937_64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/bert_config.h"
#include "models/safetensors.h"

namespace fusekit::models {

class BertInitialWeights {
 public:
  BertInitialWeights(const BertConfig& config, uint64_t seed, kernels::DType representable, float bias_std = 0.f);
  BertInitialWeights(const BertInitialWeights&) = delete;
  BertInitialWeights& operator=(const BertInitialWeights&) = delete;
  // F32 tensors in Hugging Face's names (separate query, key and value; no decoder weight): what
  // BertMlmModel::load_state_dict takes. Views into this object.
  const std::vector<TensorView>& tensors() const { return views_; }

 private:
  std::vector<std::byte> flat_, scratch_;
  std::vector<TensorView> views_;
};

}  // namespace fusekit::models
