// BERT's attention core as one fused kernel forward and one (seq <= 128, head_dim <= 64) or two fused
// kernels backward: scaled scores, key-padding mask, softmax, dropout on the probabilities, and the
// product with V.
//
// Per sequence b, head h, query i, key j (L = valid_lengths[b], clamped to [0, seq]):
//   S[i,j] = scale * q_i . k_j          for j < L; keys j >= L are masked (they get weight 0)
//   P      = softmax_j(S),   lse_i = log sum_{j < L} exp(S[i,j])    (saved in float for the backward)
//   M[i,j] = kept[i,j] / (1 - p)        kept from the Philox stream (seed, offset) at element
//                                       ((b * heads + h) * seq + i) * seq + j; p = 0 keeps all
//   O      = (P * M) V
// backward, from dO:
//   D_i = sum_c dO[i,c] O[i,c]          (FlashAttention's identity: D_i = sum_j P[i,j] dP[i,j])
//   dV = (P * M)^T dO,  dP = (dO V^T) * M,  dS = P * (dP - D),  dQ = scale dS K,  dK = scale dS^T Q
// A sequence with L = 0 has no key to attend to: its output rows are 0, its lse 0, and its
// gradients 0 (PyTorch's additive-mask composition would instead average V over all keys).
// Every query row, padded or not, attends to the L valid keys (a key-padding mask only).
//
// Layouts (T = half or bfloat16; fp32 is not supported):
//   qkv, dqkv  [batch, seq, 3, heads, head_dim], as BERT's fused QKV projection writes it;
//   out, dout  [batch, seq, heads * head_dim], what the output projection reads (no transpose);
//   valid_lengths int32 [batch] on the device;  lse float [batch, heads, seq];
//   workspace  float [batch, heads, seq] (D, written by the two-kernel backward's first kernel; the
//              block-per-head backward does not use it).
// head_dim 32, 64 or 128; seq >= 1 (any length: tiles past the end are zero-padded); scale a
// positive normal finite float (usually 1 / sqrt(head_dim)). Pointers to qkv, out, dout and dqkv
// must be 16-byte aligned.
//
// Design (FlashAttention-2 on mma.sync m16n8k16): the forward runs a block of 4 warps per
// (sequence, head, 64 queries), each warp owning 16 query rows, that walks the valid keys 64 at a
// time (K and V double-buffered with cp.async) with an online softmax; the scores, P (dropout
// applied in registers) and the O accumulator stay in mma fragments, and P becomes the left operand
// of P V without leaving registers, so neither S nor P reaches shared or global memory. The
// backward avoids atomics. Where seq <= 128 and head_dim <= 64 (BERT's usual shapes) it is one
// kernel with a block per (sequence, head) holding the whole head in shared memory: its warps own
// 16 keys each as rows (S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T are the left operands of dV
// and dK in registers), write dS^T to shared memory, and after a barrier own 16 queries each for
// dQ = dS K; the scores are computed once. Otherwise a first kernel per (sequence, head, 64
// queries) computes D and dQ (walking the key tiles), and a second per (sequence, head, 64 keys)
// computes dK and dV (walking the query tiles) as above, so the scores are computed twice. Every
// kernel recomputes P from lse and regenerates the dropout mask instead of storing them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace fusekit::kernels {

struct BertAttentionShape {
  int batch;
  int heads;     // 1..1024
  int seq;       // 1..65536
  int head_dim;  // 32, 64 or 128
};

struct BertAttentionDropout {
  float p = 0.f;  // in [0, 1); 0: no dropout
  uint64_t seed = 0;
  uint64_t offset = 0;                // advance per call for a fresh mask; the backward takes the forward's values
  const uint64_t* counter = nullptr;  // device, optional: offset + *counter, read when the kernel runs
};

// Throws std::invalid_argument with one message for an unsupported shape, dtype or dropout p.
void check_bert_attention(DType dtype, const BertAttentionShape& shape, float p);

// out and lse from qkv.
void bert_attention_forward(DType dtype, const void* qkv, const int32_t* valid_lengths, void* out, float* lse,
                            const BertAttentionShape& shape, float scale, const BertAttentionDropout& dropout,
                            cudaStream_t stream);

// Bytes of workspace bert_attention_backward needs: a float per (sequence, head, query).
size_t bert_attention_backward_workspace_bytes(const BertAttentionShape& shape);

// dqkv from dout, with the forward's out and lse and the same dropout (seed, offset).
void bert_attention_backward(DType dtype, const void* qkv, const int32_t* valid_lengths, const void* out,
                             const float* lse, const void* dout, void* dqkv, void* workspace,
                             const BertAttentionShape& shape, float scale, const BertAttentionDropout& dropout,
                             cudaStream_t stream);

}  // namespace fusekit::kernels
