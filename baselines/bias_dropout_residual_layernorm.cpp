#include "baselines/bias_dropout_residual_layernorm.h"

#include <torch/torch.h>

#include <vector>

namespace fusekit::baselines {
namespace {

BiasDropoutResidualLayerNormOutputs compose(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                            const at::Tensor& gamma, const at::Tensor& beta, double p, double eps,
                                            const at::Tensor& mask) {
  const at::Tensor dropped = mask.defined() ? (x + bias) * mask * (1.0 / (1.0 - p)) : at::dropout(x + bias, p, true);
  at::Tensor h = dropped + residual;
  at::Tensor y = at::layer_norm(h, {x.size(-1)}, gamma, beta, eps);
  return {h, y};
}

}  // namespace

BiasDropoutResidualLayerNormOutputs bias_dropout_residual_layernorm_forward(const at::Tensor& x, const at::Tensor& bias,
                                                                            const at::Tensor& residual,
                                                                            const at::Tensor& gamma,
                                                                            const at::Tensor& beta, double p,
                                                                            double eps, const at::Tensor& mask) {
  torch::NoGradGuard no_grad;
  return compose(x, bias, residual, gamma, beta, p, eps, mask);
}

BiasDropoutResidualLayerNormGradients bias_dropout_residual_layernorm_forward_backward(
    const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& gamma,
    const at::Tensor& beta, const at::Tensor& dy, const at::Tensor& dh_extra, double p, double eps,
    const at::Tensor& mask) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor bv = bias.detach().requires_grad_(true);
  at::Tensor rv = residual.detach().requires_grad_(true);
  at::Tensor gv = gamma.detach().requires_grad_(true);
  at::Tensor betav = beta.detach().requires_grad_(true);
  const BiasDropoutResidualLayerNormOutputs out = compose(xv, bv, rv, gv, betav, p, eps, mask);
  if (dh_extra.defined()) {
    torch::autograd::backward({out.y, out.h}, {dy, dh_extra});
  } else {
    out.y.backward(dy);
  }
  return {out.h.detach(), out.y.detach(), xv.grad(), rv.grad(), bv.grad(), gv.grad(), betav.grad()};
}

}  // namespace fusekit::baselines
