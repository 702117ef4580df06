// Random Swin weights as a timm 1.x state dict, the same for every variant, as timm 1.x initializes
// SwinTransformer (init_weights with mode '': init_weights_vit_timm on every Linear):
// - Linear weights (qkv, proj, fc1, fc2, downsample.reduction, head.fc) and the relative position
//   bias tables: trunc_normal(std 0.02), timm's trunc_normal_ with its bounds -2 and 2 (absolute,
//   i.e. about 100 std: in effect normal(0, 0.02));
// - Linear biases: zero;
// - LayerNorm weights 1, biases 0 (torch's default);
// - the patch embedding Conv2d: torch's default, which timm leaves alone: weight and bias uniform in
//   +-1/sqrt(fan_in), fan_in = in_channels x patch^2 (kaiming_uniform with a = sqrt(5)).
// Every value is rounded through `representable` (fp16 or bf16), so that a variant storing its
// parameters in that type starts from exactly the weights an fp32 variant starts from.
// Deterministic in the seed (std::mt19937_64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "models/safetensors.h"
#include "models/swin_config.h"

namespace fusekit::models {

class SwinInitialWeights {
 public:
  SwinInitialWeights(const SwinConfig& config, uint64_t seed, kernels::DType representable);
  SwinInitialWeights(const SwinInitialWeights&) = delete;
  SwinInitialWeights& operator=(const SwinInitialWeights&) = delete;
  // F32 tensors in timm 1.x's names: what load_swin_state_dict takes. Views into this object.
  const std::vector<TensorView>& tensors() const { return views_; }

 private:
  std::vector<std::byte> flat_;
  std::vector<TensorView> views_;
};

}  // namespace fusekit::models
