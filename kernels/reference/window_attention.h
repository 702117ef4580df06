// Float64 reference of Swin window attention, forward and backward (the math and the layouts are in
// kernels/window_attention.h): per window b and head h, S = scale Q K^T + table[index, h] +
// mask[b % mask_windows], P = softmax over the keys, O = P V; the backward by the chain rule, each
// gradient computed directly (P and dP kept in full, no saved statistics).
#pragma once

#include <vector>

namespace fusekit::reference {

struct WindowAttentionSizes {
  int windows;
  int heads;
  int tokens;
  int head_dim;
  int mask_windows;  // 0: no mask
};

struct WindowAttentionOutputs {
  std::vector<double> out;  // [windows, tokens, heads * head_dim]
  std::vector<double> lse;  // [windows, heads, tokens]: log sum_j exp(S[i, j])
};

struct WindowAttentionGradients {
  std::vector<double> dqkv;    // [windows, tokens, 3, heads, head_dim]
  std::vector<double> dtable;  // the table's layout, [entries, heads]
};

// qkv: [windows, tokens, 3, heads, head_dim]; table: [entries, heads]; index: [tokens, tokens] with
// entries in [0, entries); mask: [mask_windows, tokens, tokens] (empty when mask_windows is 0).
WindowAttentionOutputs window_attention_forward(const std::vector<double>& qkv, const std::vector<double>& table,
                                                const std::vector<int>& index, const std::vector<double>& mask,
                                                const WindowAttentionSizes& sizes, double scale);

// dout: [windows, tokens, heads * head_dim].
WindowAttentionGradients window_attention_backward(const std::vector<double>& qkv, const std::vector<double>& table,
                                                   const std::vector<int>& index, const std::vector<double>& mask,
                                                   const std::vector<double>& dout, const WindowAttentionSizes& sizes,
                                                   double scale);

}  // namespace fusekit::reference
