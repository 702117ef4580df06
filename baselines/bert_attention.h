// BERT's attention core as PyTorch eager computes it in HuggingFace's BertSelfAttention without SDPA
// ("eager" attention): qkv split and permuted to q, k, v [batch, heads, seq, head_dim], q @ k^T *
// scale, plus the additive key-padding mask (0 for valid keys, the dtype's lowest finite value for
// padded ones, as HuggingFace's get_extended_attention_mask builds it), softmax, dropout, @ v,
// permute and reshape to [batch, seq, heads * head_dim]; autograd for the backward. Also the same
// through at::scaled_dot_product_attention with a boolean mask and its own dropout ("sdpa").
//
// Layouts as kernels/bert_attention.h: qkv [batch, seq, 3, heads, head_dim], valid_lengths int32 or
// int64 [batch] on the device. Differences from the fused kernels: a sequence with no valid key
// attends uniformly to all keys here (the finite mask value) where the kernels give 0; dropout
// draws from PyTorch's generator, so only p = 0 compares numerically.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

// The masks are built once per batch from the valid lengths (as HuggingFace builds the extended
// mask once per model forward and every layer reuses it), not by the attention calls.
// The additive mask [batch, 1, 1, seq] in `dtype`: 0 where j < valid_lengths[b], else the lowest
// finite value of the dtype.
at::Tensor bert_additive_mask(const at::Tensor& valid_lengths, int64_t seq, at::ScalarType dtype);
// The boolean mask [batch, 1, 1, seq] for SDPA: true where j < valid_lengths[b].
at::Tensor bert_key_mask(const at::Tensor& valid_lengths, int64_t seq);

// Returns out [batch, seq, heads * head_dim]. dropout_p > 0 applies at::dropout (training mode).
at::Tensor bert_attention_forward(const at::Tensor& qkv, const at::Tensor& additive_mask, double scale,
                                  double dropout_p);

struct BertAttentionGradients {
  at::Tensor out, dqkv;
};

// Forward with autograd on, then backward from dout, as one eager training step runs it.
BertAttentionGradients bert_attention_forward_backward(const at::Tensor& qkv, const at::Tensor& additive_mask,
                                                       double scale, double dropout_p, const at::Tensor& dout);

// The same through at::scaled_dot_product_attention (key_mask from bert_key_mask, dropout_p).
at::Tensor bert_attention_sdpa_forward(const at::Tensor& qkv, const at::Tensor& key_mask, double scale,
                                       double dropout_p);
BertAttentionGradients bert_attention_sdpa_forward_backward(const at::Tensor& qkv, const at::Tensor& key_mask,
                                                            double scale, double dropout_p, const at::Tensor& dout);

}  // namespace fusekit::baselines
