// LayerNorm as PyTorch eager computes it (at::layer_norm; autograd for the backward), on tensors
// that wrap fusekit's own device buffers, so the baseline and the fused kernels read the same data.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

at::Tensor layernorm_forward(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps);

struct LayerNormGradients {
  at::Tensor y, dx, dgamma, dbeta;
};

// Forward with autograd on, then backward from dy, as one eager training step runs it.
LayerNormGradients layernorm_forward_backward(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                                              const at::Tensor& dy, double eps);

}  // namespace fusekit::baselines
