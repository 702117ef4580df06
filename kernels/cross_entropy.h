// Cross-entropy over logits, fused with the log-softmax, forward and backward, with ignore_index
// and label smoothing as torch.nn.functional.cross_entropy defines them (reduction "mean").
//
//   lse_r    = log sum_c exp(x[r,c])
//   target   = (1 - eps) * onehot(label_r) + eps / V
//   loss_r   = sum_c target_c * (lse_r - x[r,c]) = (1 - eps) * (lse_r - x[r,label_r]) + eps * (lse_r - mean_c x[r,c])
//              0 for a row whose label is ignore_index
//   mean     = sum_r loss_r / count,  count = rows whose label is not ignore_index
//   backward: dx[r,c] = (exp(x[r,c] - lse_r) - target_c) * dloss / count;  0 in ignored rows
//
// logits, dlogits: [rows, V] row-major, of one storage type (float, half or bfloat16); labels: [rows]
// int64 (PyTorch's class-index type). losses and logsumexp: [rows] float, written by the forward
// (the backward recomputes the softmax from logits and logsumexp: probabilities never reach global
// memory). mean_loss: one float; valid_rows: one int (count), which the backward reads; dloss: one
// float, the gradient of the mean loss. All of these are device pointers.
//
// Where PyTorch differs or is undefined:
// - every row ignored (count 0): PyTorch's mean is 0/0 = NaN; here the mean is 0 and dlogits is all
//   zeros, so a batch with nothing to learn from leaves the weights alone.
// - a label outside [0, V) that is not ignore_index: PyTorch stops with a device assert; here that
//   row's loss and its dlogits row are NaN (and it counts), so the mean is NaN, visibly.
// As in PyTorch: -inf logits (masked vocabulary entries) take no probability; a row whose label
// logit is -inf has loss +inf; with eps > 0 any -inf in a row makes its loss +inf (the smoothing
// term sums every log-probability); a row that is -inf throughout gives NaN. The gradients stay
// finite in all these cases except the last.
//
// The mean is deterministic: a second one-block kernel sums the per-row losses in float64 in a
// fixed order (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace fusekit::kernels {

// rows >= 0, vocab >= 1, 0 <= label_smoothing < 1; throws std::invalid_argument otherwise.
void cross_entropy_forward(DType dtype, const void* logits, const int64_t* labels, float* losses, float* logsumexp,
                           float* mean_loss, int* valid_rows, int rows, int vocab, int64_t ignore_index,
                           float label_smoothing, cudaStream_t stream);

void cross_entropy_backward(DType dtype, const void* logits, const int64_t* labels, const float* logsumexp,
                            const int* valid_rows, const float* dloss, void* dlogits, int rows, int vocab,
                            int64_t ignore_index, float label_smoothing, cudaStream_t stream);

}  // namespace fusekit::kernels
