#include "baselines/linear.h"

#include <torch/torch.h>

namespace fusekit::baselines {

at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool gelu) {
  torch::NoGradGuard no_grad;
  at::Tensor y = at::linear(x, weight, bias);
  return gelu ? at::gelu(y, "tanh") : y;
}

LinearGradients linear_forward_backward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                        const at::Tensor& dy) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor wv = weight.detach().requires_grad_(true);
  at::Tensor bv = bias.detach().requires_grad_(true);
  at::Tensor y = at::linear(xv, wv, bv);
  y.backward(dy);
  return {y.detach(), at::Tensor(), at::Tensor(), xv.grad(), wv.grad(), bv.grad()};
}

LinearGradients linear_gelu_forward_backward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                             const at::Tensor& dz, const at::Tensor& weight_next) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor wv = weight.detach().requires_grad_(true);
  at::Tensor bv = bias.detach().requires_grad_(true);
  at::Tensor pre = at::linear(xv, wv, bv);
  pre.retain_grad();
  at::Tensor y = at::gelu(pre, "tanh");
  at::Tensor dy;
  {
    torch::NoGradGuard no_grad;
    dy = at::matmul(dz, weight_next);
  }
  y.backward(dy);
  return {y.detach(), pre.detach(), pre.grad(), xv.grad(), wv.grad(), bv.grad()};
}

}  // namespace fusekit::baselines
