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

void qkv_projection_forward(const at::Tensor& x, const at::Tensor (&weights)[3], const at::Tensor (&biases)[3]) {
  torch::NoGradGuard no_grad;
  for (int part = 0; part < 3; ++part) (void)at::linear(x, weights[part], biases[part]);
}

void qkv_projection_forward_backward(const at::Tensor& x, const at::Tensor (&weights)[3], const at::Tensor (&biases)[3],
                                     const at::Tensor& dqkv) {
  at::Tensor xv = x.detach().requires_grad_(true);
  std::vector<at::Tensor> outputs, grads;
  const at::Tensor parts = dqkv.view({x.size(0), 3, weights[0].size(0)});
  std::vector<at::Tensor> leaves;
  for (int part = 0; part < 3; ++part) {
    at::Tensor w = weights[part].detach().requires_grad_(true), b = biases[part].detach().requires_grad_(true);
    leaves.insert(leaves.end(), {w, b});
    outputs.push_back(at::linear(xv, w, b));
    grads.push_back(parts.select(1, part));
  }
  torch::autograd::backward(outputs, grads);
}

}  // namespace fusekit::baselines
