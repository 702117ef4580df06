// AdamW as PyTorch runs it on CUDA, on tensors that wrap fusekit's own device buffers:
// torch.optim.AdamW(fused=True).step() (at::_fused_adamw_ over the tensor lists), the same under
// AMP's GradScaler, and torch.optim.AdamW(foreach=True).step() (the _foreach op sequence).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace fusekit::baselines {

struct AdamWHyperparameters {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
};

// One entry per parameter tensor. `steps` are what torch.optim keeps per parameter for fused=True:
// 0-dim float32 tensors on the parameters' device (for the foreach step they are not read).
struct AdamWTensors {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

// torch.optim.AdamW(fused=True).step(): steps += 1, then one at::_fused_adamw_ over the lists.
void adamw_fused_step(const AdamWTensors& tensors, const AdamWHyperparameters& h);
// The same as GradScaler.step runs it after scaler.unscale_(optimizer) (the gradients unscaled
// already): at::_fused_adamw_ with found_inf (0-dim float32 on the device; where it is nonzero the
// kernel changes nothing) and no grad_scale, then steps -= found_inf.
void adamw_fused_step(const AdamWTensors& tensors, const AdamWHyperparameters& h, const at::Tensor& found_inf);

// GradScaler's state: the scale, its growth tracker, the found-inf flag (0-dim float32 on the GPU).
struct GradScalerState {
  at::Tensor scale, growth_tracker, found_inf, unit;
};
GradScalerState make_grad_scaler(double init_scale, const at::Device& device);

// scaler.step(AdamW(fused=True)); scaler.update(), as AMP training runs it: the non-finite check of
// the gradients (_amp_foreach_non_finite_check_and_unscale_ with unit inverse scale: the fused
// kernel unscales), steps += 1, at::_fused_adamw_ with grad_scale and found_inf (it unscales the
// gradients, writes them back, and skips everything when found_inf is set), steps -= found_inf,
// then _amp_update_scale_.
void adamw_fused_amp_step(const AdamWTensors& tensors, const AdamWHyperparameters& h, GradScalerState& scaler);

// torch.optim.AdamW(foreach=True).step() without capturable: `step` (1 for the first) is the host
// step count from which the bias corrections are computed.
void adamw_foreach_step(const AdamWTensors& tensors, const AdamWHyperparameters& h, int64_t step);

}  // namespace fusekit::baselines
