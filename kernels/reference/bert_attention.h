// Float64 reference of BERT's attention core, forward and backward (the math and the layouts are in
// kernels/bert_attention.h): per sequence b and head h, S = scale Q K^T over the valid keys
// j < valid_lengths[b], P = softmax over them, O = (P * M) V with M the dropout multipliers; the
// backward by the chain rule, each gradient computed directly (P and dP kept in full, no saved
// statistics). A sequence with no valid key has out 0, lse 0 and gradients 0.
#pragma once

#include <cstdint>
#include <vector>

namespace fusekit::reference {

struct BertAttentionSizes {
  int batch;
  int heads;
  int seq;
  int head_dim;
};

// M[((b * heads + h) * seq + i) * seq + j] = kept / (1 - p) from the Philox stream (seed, offset)
// (kernels/detail/philox.cuh), the elements the kernels draw; p = 0: all 1.
std::vector<double> bert_attention_dropout_multipliers(const BertAttentionSizes& sizes, float p, uint64_t seed,
                                                       uint64_t offset);

struct BertAttentionOutputs {
  std::vector<double> out;  // [batch, seq, heads * head_dim]
  std::vector<double> lse;  // [batch, heads, seq]: log sum_{j < valid} exp(S[i, j])
};

// qkv: [batch, seq, 3, heads, head_dim]; valid_lengths: [batch] (clamped to [0, seq]);
// multipliers: [batch, heads, seq, seq], or empty for no dropout.
BertAttentionOutputs bert_attention_forward(const std::vector<double>& qkv, const std::vector<int>& valid_lengths,
                                            const std::vector<double>& multipliers, const BertAttentionSizes& sizes,
                                            double scale);

// dout: [batch, seq, heads * head_dim]; returns dqkv [batch, seq, 3, heads, head_dim].
// D_i = sum_j P[i,j] dP[i,j] by default. Given `out` (an O, e.g. the forward's as a kernel stored it),
// D_i = sum_c dO[i,c] out[i,c] instead: FlashAttention's identity, which the fused backward uses; the
// two agree for the exact O (dropout included), and differ by the rounding of a stored one.
std::vector<double> bert_attention_backward(const std::vector<double>& qkv, const std::vector<int>& valid_lengths,
                                            const std::vector<double>& multipliers, const std::vector<double>& dout,
                                            const BertAttentionSizes& sizes, double scale,
                                            const std::vector<double>& out = {});

}  // namespace fusekit::reference
