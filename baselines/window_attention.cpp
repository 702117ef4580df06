#include "baselines/window_attention.h"

#include <torch/torch.h>

namespace fusekit::baselines {
namespace {

at::Tensor attention(const at::Tensor& qkv, const at::Tensor& table, const at::Tensor& index, const at::Tensor& mask,
                     double scale) {
  const int64_t windows = qkv.size(0), tokens = qkv.size(1), heads = qkv.size(3), dim = qkv.size(4);
  const at::Tensor parts = qkv.permute({2, 0, 3, 1, 4});  // [3, windows, heads, tokens, head_dim]
  const at::Tensor q = parts[0] * scale, k = parts[1], v = parts[2];
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  const at::Tensor bias =
      table.index_select(0, index.reshape({-1})).view({tokens, tokens, heads}).permute({2, 0, 1}).contiguous();
  scores = scores + bias.unsqueeze(0);
  if (mask.defined()) {
    const int64_t mask_windows = mask.size(0);
    scores = scores.view({windows / mask_windows, mask_windows, heads, tokens, tokens}) +
             mask.to(scores.scalar_type()).unsqueeze(1).unsqueeze(0);
    scores = scores.view({windows, heads, tokens, tokens});
  }
  const at::Tensor probabilities = at::softmax(scores, -1);
  return at::matmul(probabilities, v).transpose(1, 2).reshape({windows, tokens, heads * dim});
}

}  // namespace

at::Tensor window_attention_forward(const at::Tensor& qkv, const at::Tensor& table, const at::Tensor& index,
                                    const at::Tensor& mask, double scale) {
  torch::NoGradGuard no_grad;
  return attention(qkv, table, index, mask, scale);
}

WindowAttentionGradients window_attention_forward_backward(const at::Tensor& qkv, const at::Tensor& table,
                                                           const at::Tensor& index, const at::Tensor& mask,
                                                           double scale, const at::Tensor& dout) {
  at::Tensor qkv_leaf = qkv.detach().requires_grad_(true);
  at::Tensor table_leaf = table.detach().requires_grad_(true);
  at::Tensor out = attention(qkv_leaf, table_leaf, index, mask, scale);
  out.backward(dout);
  return {out.detach(), qkv_leaf.grad(), table_leaf.grad()};
}

}  // namespace fusekit::baselines
