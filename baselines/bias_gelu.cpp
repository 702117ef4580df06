#include "baselines/bias_gelu.h"

#include <torch/torch.h>

namespace fusekit::baselines {

at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, const std::string& approximate) {
  torch::NoGradGuard no_grad;
  return at::gelu(x + bias, approximate);
}

BiasGeluGradients bias_gelu_forward_backward(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& dy,
                                             const std::string& approximate) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor bv = bias.detach().requires_grad_(true);
  at::Tensor y = at::gelu(xv + bv, approximate);
  y.backward(dy);
  return {y.detach(), xv.grad(), bv.grad()};
}

}  // namespace fusekit::baselines
