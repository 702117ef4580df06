// The linear layer as PyTorch eager computes it: at::linear (x W^T + b; for a 2-D input on CUDA
// that is at::addmm, which may itself use cuBLASLt's bias epilogue in recent PyTorch), then, for
// bias_gelu, at::gelu(approximate="tanh") as a separate kernel: the tanh form, the one cuBLASLt
// computes. Backward through autograd.
//
// The bias_gelu backward starts where fusekit's does (kernels/linear.h): at the gradient dz of the
// next layer's output and its weight W_next [N2, N]; dy = dz W_next is one more GEMM, then autograd
// runs gelu_backward, the bias sum and the two gradient GEMMs as separate kernels.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

// y = x W^T + b, or gelu_tanh(x W^T + b) with `gelu`.
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool gelu);

struct LinearGradients {
  at::Tensor y, pre, dpre, dx, dweight, dbias;  // pre, dpre: bias_gelu only
};

// Bias: forward with autograd on, then backward from dy.
LinearGradients linear_forward_backward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                        const at::Tensor& dy);

// Bias + GELU: forward with autograd on, dy = dz W_next, then backward from dy.
LinearGradients linear_gelu_forward_backward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                             const at::Tensor& dz, const at::Tensor& weight_next);

// BERT's QKV projection as HuggingFace's BertSelfAttention computes it: three at::linear calls
// (query, key, value), each reading x. Forward only, or forward + backward from dqkv [tokens,
// 3 * hidden] (the gradient of each projection is its third: what the fused attention backward
// writes).
void qkv_projection_forward(const at::Tensor& x, const at::Tensor (&weights)[3], const at::Tensor (&biases)[3]);
void qkv_projection_forward_backward(const at::Tensor& x, const at::Tensor (&weights)[3], const at::Tensor (&biases)[3],
                                     const at::Tensor& dqkv);

}  // namespace fusekit::baselines
