#include "baselines/cross_entropy.h"

#include <torch/torch.h>

namespace fusekit::baselines {

at::Tensor cross_entropy_forward(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index,
                                 double label_smoothing) {
  torch::NoGradGuard no_grad;
  return at::cross_entropy_loss(logits, labels, {}, at::Reduction::Mean, ignore_index, label_smoothing);
}

at::Tensor cross_entropy_losses(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index,
                                double label_smoothing) {
  torch::NoGradGuard no_grad;
  return at::cross_entropy_loss(logits, labels, {}, at::Reduction::None, ignore_index, label_smoothing);
}

CrossEntropyGradients cross_entropy_forward_backward(const at::Tensor& logits, const at::Tensor& labels,
                                                     int64_t ignore_index, double label_smoothing,
                                                     const at::Tensor& dloss) {
  at::Tensor x = logits.detach().requires_grad_(true);
  at::Tensor loss = at::cross_entropy_loss(x, labels, {}, at::Reduction::Mean, ignore_index, label_smoothing);
  loss.backward(dloss.to(loss.scalar_type()));
  return {loss.detach(), x.grad()};
}

}  // namespace fusekit::baselines
