// Scale, mask and softmax of attention scores over the keys, forward and backward.
//
//   forward:  z[b,h,q,k] = scale * x[b,h,q,k] + bias term, or -inf where the mask removes key k
//             y[b,h,q,k] = exp(z - max_k z) / sum_k exp(z - max_k z)
//   backward: dx[b,h,q,k] = scale * y * (dy - sum_k dy * y)
//
// x, y, dy, dx: [batch, heads, queries, keys] row-major, one row of `keys` scores per (b, h, q), all
// of one storage type (float, half or bfloat16); arithmetic is in float. The masks:
//   none     nothing removed;
//   padding  keys k >= lengths[b] removed (lengths: int32 [batch], clamped to [0, keys]);
//   causal   keys k > q + keys - queries removed: the diagonal meets the bottom-right corner, as in
//            FlashAttention and PyTorch's causal_lower_right (PyTorch's is_causal=True aligns it to
//            the top left instead; both agree when queries == keys). With queries > keys the first
//            queries - keys rows keep no key;
//   bias     Swin's additive terms: bias [heads, queries, keys] broadcast over the batch, plus an
//            optional window mask [windows, queries, keys] that batch entry b takes as b % windows
//            (Swin's shifted-window mask). Both in the storage type; -inf entries remove a key.
// A row whose every key is removed gets y = 0 (PyTorch gives NaN there), and its dx is then 0.
//
// The backward needs only y and dy: y is 0 wherever the forward removed a key, so dx is 0 there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace fusekit::kernels {

struct SoftmaxShape {
  int batch;
  int heads;
  int queries;
  int keys;
};

enum class SoftmaxMask { none, padding, causal, bias };

// "none", "padding", "causal", "bias": the names the suite's shape syntax uses.
inline const char* softmax_mask_name(SoftmaxMask mask) {
  switch (mask) {
    case SoftmaxMask::none:
      return "none";
    case SoftmaxMask::padding:
      return "padding";
    case SoftmaxMask::causal:
      return "causal";
    case SoftmaxMask::bias:
      return "bias";
  }
  return "?";
}

// What removes or shifts the scores; the fields a kind does not use are ignored.
struct SoftmaxMasking {
  SoftmaxMask kind = SoftmaxMask::none;
  const int32_t* lengths = nullptr;   // padding: [batch] on the device
  const void* bias = nullptr;         // bias: [heads, queries, keys]
  const void* window_mask = nullptr;  // bias, may be null: [windows, queries, keys]
  int windows = 0;                    // with window_mask: >= 1
};

void softmax_forward(DType dtype, const void* x, void* y, SoftmaxShape shape, float scale,
                     const SoftmaxMasking& masking, cudaStream_t stream);

void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, SoftmaxShape shape, float scale,
                      cudaStream_t stream);

}  // namespace fusekit::kernels
