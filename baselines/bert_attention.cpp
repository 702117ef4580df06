#include "baselines/bert_attention.h"

#include <torch/torch.h>

#include <limits>
#include <vector>

namespace fusekit::baselines {
namespace {

at::Tensor key_is_valid(const at::Tensor& valid_lengths, int64_t seq) {
  const at::Tensor positions = at::arange(seq, at::TensorOptions().dtype(at::kLong).device(valid_lengths.device()));
  return positions.unsqueeze(0) < valid_lengths.to(at::kLong).unsqueeze(1);  // [batch, seq]
}

double lowest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return -65504.0;
    case at::kBFloat16:
      return -3.3895313892515355e38;
    case at::kFloat:
      return std::numeric_limits<float>::lowest();
    default:
      return std::numeric_limits<double>::lowest();
  }
}

at::Tensor eager(const at::Tensor& qkv, const at::Tensor& additive_mask, double scale, double dropout_p) {
  const int64_t batch = qkv.size(0), seq = qkv.size(1), heads = qkv.size(3), dim = qkv.size(4);
  const at::Tensor parts = qkv.permute({2, 0, 3, 1, 4});  // [3, batch, heads, seq, head_dim]
  const at::Tensor q = parts[0], k = parts[1], v = parts[2];
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  scores = scores + additive_mask;
  at::Tensor probabilities = at::softmax(scores, -1);
  if (dropout_p > 0) probabilities = at::dropout(probabilities, dropout_p, /*train=*/true);
  return at::matmul(probabilities, v).permute({0, 2, 1, 3}).reshape({batch, seq, heads * dim});
}

at::Tensor sdpa(const at::Tensor& qkv, const at::Tensor& key_mask, double scale, double dropout_p) {
  const int64_t batch = qkv.size(0), seq = qkv.size(1), heads = qkv.size(3), dim = qkv.size(4);
  // unbind rather than three selects: autograd then stacks the three gradients in one copy instead
  // of zero-filling a tensor the size of qkv for each of q, k and v and adding them.
  const std::vector<at::Tensor> parts = qkv.permute({2, 0, 3, 1, 4}).unbind(0);
  const at::Tensor out =
      at::scaled_dot_product_attention(parts[0], parts[1], parts[2], key_mask, dropout_p, /*is_causal=*/false, scale);
  return out.permute({0, 2, 1, 3}).reshape({batch, seq, heads * dim});
}

}  // namespace

at::Tensor bert_additive_mask(const at::Tensor& valid_lengths, int64_t seq, at::ScalarType dtype) {
  const at::Tensor valid = key_is_valid(valid_lengths, seq);
  const at::Tensor zero = at::zeros({}, at::TensorOptions().dtype(dtype).device(valid_lengths.device()));
  const at::Tensor masked =
      at::full({}, lowest(dtype), at::TensorOptions().dtype(dtype).device(valid_lengths.device()));
  return at::where(valid, zero, masked).view({valid.size(0), 1, 1, seq});
}

at::Tensor bert_key_mask(const at::Tensor& valid_lengths, int64_t seq) {
  const at::Tensor valid = key_is_valid(valid_lengths, seq);
  return valid.view({valid.size(0), 1, 1, seq});
}

at::Tensor bert_attention_forward(const at::Tensor& qkv, const at::Tensor& mask, double scale, double dropout_p) {
  torch::NoGradGuard no_grad;
  return eager(qkv, mask, scale, dropout_p);
}

BertAttentionGradients bert_attention_forward_backward(const at::Tensor& qkv, const at::Tensor& mask, double scale,
                                                       double dropout_p, const at::Tensor& dout) {
  at::Tensor leaf = qkv.detach().requires_grad_(true);
  at::Tensor out = eager(leaf, mask, scale, dropout_p);
  out.backward(dout);
  return {out.detach(), leaf.grad()};
}

at::Tensor bert_attention_sdpa_forward(const at::Tensor& qkv, const at::Tensor& mask, double scale, double dropout_p) {
  torch::NoGradGuard no_grad;
  return sdpa(qkv, mask, scale, dropout_p);
}

BertAttentionGradients bert_attention_sdpa_forward_backward(const at::Tensor& qkv, const at::Tensor& mask, double scale,
                                                            double dropout_p, const at::Tensor& dout) {
  at::Tensor leaf = qkv.detach().requires_grad_(true);
  at::Tensor out = sdpa(leaf, mask, scale, dropout_p);
  out.backward(dout);
  return {out.detach(), leaf.grad()};
}

}  // namespace fusekit::baselines
