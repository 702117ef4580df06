#include "baselines/softmax.h"

#include <torch/torch.h>

#include <limits>

namespace fusekit::baselines {
namespace {

at::Tensor probabilities(const at::Tensor& x, double scale, const SoftmaxMaskTensors& mask) {
  const int64_t batch = x.size(0), heads = x.size(1), queries = x.size(2), keys = x.size(3);
  constexpr double kRemoved = -std::numeric_limits<double>::infinity();
  at::Tensor scores = x * scale;
  switch (mask.kind) {
    case SoftmaxMaskKind::none:
      break;
    case SoftmaxMaskKind::padding: {
      const at::Tensor key = at::arange(keys, mask.lengths.options()).view({1, 1, 1, keys});
      scores = scores.masked_fill(key >= mask.lengths.view({batch, 1, 1, 1}), kRemoved);
      break;
    }
    case SoftmaxMaskKind::causal: {
      const at::Tensor above = at::ones({queries, keys}, x.options().dtype(at::kBool)).triu(keys - queries + 1);
      scores = scores.masked_fill(above, kRemoved);
      break;
    }
    case SoftmaxMaskKind::bias:
      scores = scores + mask.bias.unsqueeze(0);
      if (mask.window_mask.defined()) {
        const int64_t windows = mask.window_mask.size(0);
        scores =
            scores.view({batch / windows, windows, heads, queries, keys}) + mask.window_mask.unsqueeze(1).unsqueeze(0);
        scores = scores.view({batch, heads, queries, keys});
      }
      break;
  }
  return at::softmax(scores, -1);
}

}  // namespace

at::Tensor softmax_forward(const at::Tensor& x, double scale, const SoftmaxMaskTensors& mask) {
  torch::NoGradGuard no_grad;
  return probabilities(x, scale, mask);
}

SoftmaxGradients softmax_forward_backward(const at::Tensor& x, double scale, const SoftmaxMaskTensors& mask,
                                          const at::Tensor& dy) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor y = probabilities(xv, scale, mask);
  y.backward(dy);
  return {y.detach(), xv.grad()};
}

}  // namespace fusekit::baselines
