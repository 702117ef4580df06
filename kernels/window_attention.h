// Swin window attention as one fused kernel per direction: relative position bias, optional
// shifted-window mask, softmax over the keys, and the product with V, forward and backward.
//
// Per window b (of windows = batch x windows per image), head h, query i, key j:
//   S[i,j] = scale * q_i . k_j + bias[h,i,j] + mask[b % mask_windows, i, j]
//   P      = softmax_j(S),   lse_i = log sum_j exp(S[i,j])    (saved in float for the backward)
//   O      = P V
// backward, from dO:
//   D_i = sum_c dO[i,c] O[i,c]            (FlashAttention's identity for rowsum(P * dP))
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = scale dS K,  dK = scale dS^T Q
//   dtable[t, h] = sum_b sum_{(i,j): index[i,j] = t} dS_b[h, i, j]     (the mask gets no gradient)
//
// Layouts (T = half or bfloat16 throughout; fp32 is not supported):
//   qkv, dqkv  [windows, tokens, 3, heads, head_dim], as Swin's qkv projection writes it;
//   out, dout  [windows, tokens, heads * head_dim], what Swin's output projection reads (Swin's
//              (attn @ v).transpose(1, 2).reshape(B_, N, C)): no transpose kernel runs;
//   table      [(2 window - 1)^2, heads] in T, Swin's relative_position_bias_table; dtable the same;
//   index      int32 [tokens, tokens], Swin's relative_position_index (relative_position_index()
//              below computes it on the host as Swin does; Swin keeps it in int64);
//   mask       float [mask_windows, tokens, tokens], Swin's shift mask (0 or -100), or null;
//   bias       float [heads, tokens, tokens]: the bias gathered from the table once per step by
//              window_attention_forward and read again by window_attention_backward;
//   lse        float [windows, heads, tokens].
// tokens is 49 (window 7) or 144 (window 12); head_dim 32 or 64; heads 1..64. Pointers to qkv, out,
// dout and dqkv must be 16-byte aligned.
//
// Design: a block takes a run of windows that share one head and one mask window, so the bias +
// mask it adds is read from global memory once per block; Q, K, V (and dO) of the next window are
// copied asynchronously into a second shared-memory stage while the current one is computed (one
// stage only in the backward for 144 tokens of head_dim 64: it does not fit). The
// products run on mma.sync m16n8k16 fragments (fp32 accumulators): S = Q K^T, the softmax and P live
// in registers, and P feeds P V from registers. The backward sums its dS over the block's windows in
// registers; each block stores that sum in its own slice of `workspace`, a reduction kernel sums the
// slices, and a gather kernel folds [heads, tokens, tokens] into the table's entries (no atomics:
// deterministic).
// 49 tokens (window 7): 4 warps, warp w owns query rows 16w..16w+15 (tokens padded to 64); the bias
// + mask stays in registers. The backward takes D_i = rowsum(P * dP) from its registers (so `out` is
// not read) and writes P^T and dS^T to shared memory for dV and dK.
// 144 tokens (window 12): 9 warps, no padding. A thread's share of S is 72 floats, so its bias +
// mask goes to a float table in shared memory in fragment order, written once per block. The
// backward's warps own keys instead of queries (S^T, dP^T in passes over the queries: dV from
// registers, dS^T through shared memory for dK and dQ), and take D_i = dO_i . O_i from `out`.
// The softmax and every elementwise step are in fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::kernels {

struct WindowAttentionShape {
  int windows;       // B_ = batch x windows per image
  int heads;         // 1..64
  int tokens;        // N = window^2: 49 or 144
  int head_dim;      // 32 or 64
  int mask_windows;  // windows per image of the shift mask; 0: no mask
};

// Swin's relative_position_index for a window of `window` x `window` tokens, [N, N] row-major with
// N = window^2: for tokens a = (ya, xa), b = (yb, xb), (ya - yb + window - 1) * (2 window - 1) +
// (xa - xb + window - 1).
inline std::vector<int32_t> relative_position_index(int window) {
  const int n = window * window;
  std::vector<int32_t> index(static_cast<size_t>(n) * n);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      const int dy = a / window - b / window + window - 1, dx = a % window - b % window + window - 1;
      index[static_cast<size_t>(a) * n + b] = dy * (2 * window - 1) + dx;
    }
  }
  return index;
}

// Throws std::invalid_argument with one message for an unsupported shape or dtype.
void check_window_attention(DType dtype, const WindowAttentionShape& shape);

// Gathers bias from table through index (a small kernel), then runs the fused forward: out and lse.
void window_attention_forward(DType dtype, const void* qkv, const void* table, const int32_t* index, const float* mask,
                              void* out, float* bias, float* lse, const WindowAttentionShape& shape, float scale,
                              cudaStream_t stream);

// Bytes of workspace window_attention_backward needs for this shape.
size_t window_attention_backward_workspace_bytes(const WindowAttentionShape& shape);

// dqkv and dtable from dout, with the forward's out, bias and lse.
void window_attention_backward(DType dtype, const void* qkv, const float* bias, const float* mask, const void* out,
                               const float* lse, const void* dout, const int32_t* index, void* dqkv, void* dtable,
                               void* workspace, const WindowAttentionShape& shape, float scale, cudaStream_t stream);

}  // namespace fusekit::kernels
