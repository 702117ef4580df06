#include "baselines/adamw.h"

#include <cmath>

namespace fusekit::baselines {

void adamw_fused_step(const AdamWTensors& t, const AdamWHyperparameters& h) {
  at::_foreach_add_(t.steps, 1);
  at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, {}, t.steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                    h.eps, /*amsgrad=*/false, /*maximize=*/false);
}

void adamw_fused_step(const AdamWTensors& t, const AdamWHyperparameters& h, const at::Tensor& found_inf) {
  at::_foreach_add_(t.steps, 1);
  at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, {}, t.steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                    h.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
  at::_foreach_sub_(t.steps, std::vector<at::Tensor>(t.steps.size(), found_inf));
}

GradScalerState make_grad_scaler(double init_scale, const at::Device& device) {
  const auto floats = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::full({}, init_scale, floats), at::zeros({}, floats.dtype(at::kInt)), at::zeros({}, floats),
          at::ones({}, floats)};
}

void adamw_fused_amp_step(const AdamWTensors& t, const AdamWHyperparameters& h, GradScalerState& scaler) {
  // GradScaler._check_inf_per_device: a fresh zero flag, the check with an inverse scale of 1.
  scaler.found_inf.zero_();
  at::_amp_foreach_non_finite_check_and_unscale_(t.grads, scaler.found_inf, scaler.unit);
  at::_foreach_add_(t.steps, 1);
  at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, {}, t.steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                    h.eps, /*amsgrad=*/false, /*maximize=*/false, scaler.scale, scaler.found_inf);
  at::_foreach_sub_(t.steps, std::vector<at::Tensor>(t.steps.size(), scaler.found_inf));
  // GradScaler.update() with its defaults.
  at::_amp_update_scale_(scaler.scale, scaler.growth_tracker, scaler.found_inf, 2.0, 0.5, 2000);
}

void adamw_foreach_step(const AdamWTensors& t, const AdamWHyperparameters& h, int64_t step) {
  if (h.weight_decay != 0) at::_foreach_mul_(t.params, 1 - h.lr * h.weight_decay);
  at::_foreach_lerp_(t.exp_avgs, t.grads, 1 - h.beta1);
  at::_foreach_mul_(t.exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(t.exp_avg_sqs, t.grads, t.grads, 1 - h.beta2);
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  const double step_size = h.lr / bias_correction1;
  std::vector<at::Tensor> denominators = at::_foreach_sqrt(t.exp_avg_sqs);
  at::_foreach_div_(denominators, std::sqrt(bias_correction2));
  at::_foreach_add_(denominators, h.eps);
  at::_foreach_addcdiv_(t.params, t.exp_avgs, denominators, -step_size);
}

}  // namespace fusekit::baselines
