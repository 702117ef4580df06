// Float64 reference of one AdamW step, as torch.optim.AdamW computes it (the math is in
// kernels/adamw.h): decoupled weight decay, bias corrections from the step count, eps after the
// square root.
#pragma once

#include <cstdint>
#include <vector>

namespace fusekit::reference {

struct AdamWOptions {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
};

// One step on every element, in place; `step` counts the steps taken, this one included (>= 1).
void adamw_step(std::vector<double>& param, const std::vector<double>& grad, std::vector<double>& exp_avg,
                std::vector<double>& exp_avg_sq, const AdamWOptions& options, int64_t step);
// The same with v's bias correction counting `v_step` (the AdamW steps of a trainer that also took
// frozen-variance steps, kernels/adamw.h), m's counting `step`.
void adamw_step(std::vector<double>& param, const std::vector<double>& grad, std::vector<double>& exp_avg,
                std::vector<double>& exp_avg_sq, const AdamWOptions& options, int64_t step, int64_t v_step);

// One frozen-variance step (kernels/adamw.h's AdamWTrainer::step_frozen_variance): `increment` is
// the velocity's, exp_avg_sq is read only; frozen_steps counts the steps since the freeze, this one
// included (>= 1), adamw_steps the AdamW steps taken before it (>= 1); max_step caps a step at
// max_step x lr.
void adamw_frozen_variance_step(std::vector<double>& param, const std::vector<double>& increment,
                                std::vector<double>& exp_avg, const std::vector<double>& exp_avg_sq,
                                const AdamWOptions& options, double velocity_factor, int64_t frozen_steps,
                                int64_t adamw_steps, double max_step = 1.0);

}  // namespace fusekit::reference
