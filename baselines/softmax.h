// Scale, mask and softmax of attention scores as PyTorch eager computes them: x * scale, then
// masked_fill(-inf) for a key padding or causal mask, or + bias (+ a window mask) for Swin's terms,
// then at::softmax over the keys in the storage dtype; autograd for the backward. On tensors that
// wrap fusekit's own device buffers, so the baseline and the fused kernels read the same data.
//
// The masks are those of kernels/softmax.h. The padding mask is built from the lengths as BERT
// builds its key mask ([batch, 1, 1, keys], broadcast over heads and queries); the causal one as
// a [queries, keys] triangle whose diagonal meets the bottom-right corner. The window mask takes
// Swin's view: the batch is images x windows, so it must be a multiple of the window count.
// A row that keeps no key comes out NaN here, as in PyTorch.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

enum class SoftmaxMaskKind { none, padding, causal, bias };

struct SoftmaxMaskTensors {
  SoftmaxMaskKind kind = SoftmaxMaskKind::none;
  at::Tensor lengths;      // padding: int32 [batch]
  at::Tensor bias;         // bias: [heads, queries, keys]
  at::Tensor window_mask;  // bias, may be undefined: [windows, queries, keys]
};

// x: [batch, heads, queries, keys].
at::Tensor softmax_forward(const at::Tensor& x, double scale, const SoftmaxMaskTensors& mask);

struct SoftmaxGradients {
  at::Tensor y, dx;
};

// Forward with autograd on, then backward from dy, as one eager training step runs it.
SoftmaxGradients softmax_forward_backward(const at::Tensor& x, double scale, const SoftmaxMaskTensors& mask,
                                          const at::Tensor& dy);

}  // namespace fusekit::baselines
