// Cross-entropy as PyTorch eager computes it (at::cross_entropy_loss: log_softmax, nll_loss and,
// with label smoothing, the smoothing sum; autograd for the backward), on the storage-dtype logits
// and int64 labels, on tensors that wrap fusekit's own device buffers.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fusekit::baselines {

// The mean loss over the rows whose label is not ignore_index (reduction "mean").
at::Tensor cross_entropy_forward(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index,
                                 double label_smoothing);

// The per-row losses (reduction "none"; 0 in ignored rows).
at::Tensor cross_entropy_losses(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index,
                                double label_smoothing);

struct CrossEntropyGradients {
  at::Tensor loss, dlogits;
};

// Forward with autograd on, then backward from dloss (a scalar; cast to the loss's dtype, as autograd
// would), as one eager training step runs it.
CrossEntropyGradients cross_entropy_forward_backward(const at::Tensor& logits, const at::Tensor& labels,
                                                     int64_t ignore_index, double label_smoothing,
                                                     const at::Tensor& dloss);

}  // namespace fusekit::baselines
