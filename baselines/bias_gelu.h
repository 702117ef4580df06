// bias + GELU as PyTorch eager computes it: an add kernel (z rounded to the storage type), then
// at::gelu; autograd's gelu_backward and a column sum for the backward.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace fusekit::baselines {

// approximate: "none" (erf) or "tanh", as at::gelu takes it.
at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, const std::string& approximate);

struct BiasGeluGradients {
  at::Tensor y, dx, dbias;
};

// Forward with autograd on, then backward from dy, as one eager training step runs it.
BiasGeluGradients bias_gelu_forward_backward(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& dy,
                                             const std::string& approximate);

}  // namespace fusekit::baselines
