// Bias + dropout + residual + LayerNorm as PyTorch eager computes it: at::dropout(x + bias, p, true)
// + residual, then at::layer_norm; autograd for the backward. On tensors that wrap fusekit's own
// device buffers, so the baseline and the fused kernels read the same data.
//
// `mask` (tests only): PyTorch's dropout RNG cannot be made to draw fusekit's mask, so a test passes
// the fused kernels' mask (1 kept, 0 dropped) and dropout becomes (x + bias) * mask / (1 - p), the
// same arithmetic with that mask. Undefined: at::dropout draws its own.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

struct BiasDropoutResidualLayerNormOutputs {
  at::Tensor h;  // residual + dropout(x + bias): the new residual stream in pre-LN
  at::Tensor y;  // LayerNorm(h)
};

BiasDropoutResidualLayerNormOutputs bias_dropout_residual_layernorm_forward(const at::Tensor& x, const at::Tensor& bias,
                                                                            const at::Tensor& residual,
                                                                            const at::Tensor& gamma,
                                                                            const at::Tensor& beta, double p,
                                                                            double eps, const at::Tensor& mask = {});

struct BiasDropoutResidualLayerNormGradients {
  at::Tensor h, y, dx, dresidual, dbias, dgamma, dbeta;
};

// Forward with autograd on, then backward from dy into y and, where defined (pre-LN), dh_extra into
// h, as one eager training step runs it.
BiasDropoutResidualLayerNormGradients bias_dropout_residual_layernorm_forward_backward(
    const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& gamma,
    const at::Tensor& beta, const at::Tensor& dy, const at::Tensor& dh_extra, double p, double eps,
    const at::Tensor& mask = {});

}  // namespace fusekit::baselines
