// The seam between a training step's backward and its optimizer, for data-parallel training: a
// model that owns its gradients in one flat buffer hands them, once the backward has written them,
// to a GradientExchange (dp/ implements it over NCCL), which leaves on the same stream what the
// optimizer reads. The models layer knows no communicator; the exchange knows no model.
//
// The gradients hold loss_scale x the true gradients of this rank's batch. An exchange that sums
// over P ranks returns P: the optimizer then divides by loss_scale x P, so no extra pass scales the
// buffer. Padding between tensors (the flat layout's alignment) is not part of any tensor and may
// hold anything after an exchange.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::models {

struct FlatGradients {
  void* data = nullptr;  // device
  kernels::DType dtype = kernels::DType::f16;
  uint64_t elements = 0;  // the whole flat buffer, padding included
  struct Span {
    uint64_t offset = 0;  // elements into the buffer, increasing, not overlapping
    uint64_t size = 0;
  };
  std::vector<Span> tensors;  // the parameters' gradients, in the flat buffer's order
  // AdamW's second moment v over the same flat layout (fp32, device) and its eps, where the model
  // trains with AdamW: an exchange that sends AdamW's velocity with v frozen may rank entries by
  // the step they would take (dp/gradient_exchanger.h's rank_by_step). Null where there is none.
  const float* second_moment = nullptr;
  double eps = 0;
  double beta2 = 0;  // AdamW's, for the bias correction of v
};

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  // Enqueued on `stream` after the backward; returns what the gradients are divided by besides the
  // loss scale (the number of ranks summed into them; 1 where nothing was exchanged).
  virtual float exchange(const FlatGradients& gradients, cudaStream_t stream) = 0;
  // 0 where the last exchange left gradients. Otherwise it left, in their place, increments of a
  // velocity u = f u + g summed over the ranks (each rank's own velocity, sent by error feedback),
  // and returns f: the optimizer then takes AdamW's frozen-variance step (kernels/adamw.h's
  // AdamWTrainer::step_frozen_variance with velocity_factor f).
  virtual double velocity_factor() const { return 0; }
  // With velocity increments: the frozen-variance step's cap in units of lr (step_frozen_variance's
  // max_step).
  virtual double frozen_max_step() const { return 1; }
};

}  // namespace fusekit::models
