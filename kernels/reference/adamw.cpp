#include "kernels/reference/adamw.h"

#include <algorithm>
#include <cmath>

namespace fusekit::reference {

void adamw_step(std::vector<double>& param, const std::vector<double>& grad, std::vector<double>& exp_avg,
                std::vector<double>& exp_avg_sq, const AdamWOptions& o, int64_t step) {
  adamw_step(param, grad, exp_avg, exp_avg_sq, o, step, step);
}

void adamw_step(std::vector<double>& param, const std::vector<double>& grad, std::vector<double>& exp_avg,
                std::vector<double>& exp_avg_sq, const AdamWOptions& o, int64_t step, int64_t v_step) {
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(v_step));
  const double step_size = o.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < param.size(); ++i) {
    param[i] -= o.lr * o.weight_decay * param[i];
    exp_avg[i] = o.beta1 * exp_avg[i] + (1.0 - o.beta1) * grad[i];
    exp_avg_sq[i] = o.beta2 * exp_avg_sq[i] + (1.0 - o.beta2) * grad[i] * grad[i];
    param[i] -= step_size * exp_avg[i] / (std::sqrt(exp_avg_sq[i]) / bias_correction2_sqrt + o.eps);
  }
}

void adamw_frozen_variance_step(std::vector<double>& param, const std::vector<double>& increment,
                                std::vector<double>& exp_avg, const std::vector<double>& exp_avg_sq,
                                const AdamWOptions& o, double velocity_factor, int64_t frozen_steps,
                                int64_t adamw_steps, double max_step) {
  const double velocity_correction = 1.0 / (1.0 - std::pow(velocity_factor, static_cast<double>(frozen_steps)));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(adamw_steps)));
  for (size_t i = 0; i < param.size(); ++i) {
    param[i] -= o.lr * o.weight_decay * param[i];
    exp_avg[i] = (1.0 - velocity_factor) * increment[i];
    const double m_hat = exp_avg[i] * velocity_correction;
    param[i] -= o.lr * m_hat /
                (std::max(std::sqrt(exp_avg_sq[i]) / bias_correction2_sqrt, std::fabs(m_hat) / max_step) + o.eps);
  }
}

}  // namespace fusekit::reference
