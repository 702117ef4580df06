// Swin window attention as PyTorch eager computes it in Swin's WindowAttention.forward: qkv
// reshaped and permuted to q, k, v [windows, heads, tokens, head_dim], q * scale, q @ k^T, plus the
// relative position bias gathered from the table through the index (every step, as in Swin), plus
// the shift mask viewed over [images, mask_windows], softmax, @ v, transpose and reshape to
// [windows, tokens, heads * head_dim]; autograd for the backward (dqkv and the table's gradient).
//
// Layouts as kernels/window_attention.h: qkv [windows, tokens, 3, heads, head_dim], table
// [entries, heads] in qkv's dtype, index int64 (Swin's buffer) or int32 [tokens, tokens], mask float
// [mask_windows, tokens, tokens] or undefined. The float mask is cast to the scores' dtype before the
// add (a small kernel), as the scores would otherwise become float and @ v would mix dtypes.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

// Returns out [windows, tokens, heads * head_dim].
at::Tensor window_attention_forward(const at::Tensor& qkv, const at::Tensor& table, const at::Tensor& index,
                                    const at::Tensor& mask, double scale);

struct WindowAttentionGradients {
  at::Tensor out, dqkv, dtable;
};

// Forward with autograd on, then backward from dout, as one eager training step runs it.
WindowAttentionGradients window_attention_forward_backward(const at::Tensor& qkv, const at::Tensor& table,
                                                           const at::Tensor& index, const at::Tensor& mask,
                                                           double scale, const at::Tensor& dout);

}  // namespace fusekit::baselines
