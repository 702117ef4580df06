// Swin's window operations as PyTorch eager computes them in Swin's own code (at::layer_norm,
// at::roll, view, permute, contiguous, slicing, at::cat, add; autograd for the backward), on tensors
// that wrap fusekit's own device buffers. x, shortcut, y: [B, H, W, C]; windows: [B * nW, ws * ws, C].
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

// Swin's window_partition: [B, H, W, C] -> [B * nW, ws * ws, C].
at::Tensor window_partition(const at::Tensor& x, int64_t window);
// Swin's window_reverse: [B * nW, ws * ws, C] -> [B, H, W, C].
at::Tensor window_reverse(const at::Tensor& windows, int64_t window, int64_t batch, int64_t height, int64_t width);

// partition(roll(layer_norm(x), (-shift, -shift), (1, 2))), as a Swin block's norm1, shift, partition.
at::Tensor window_partition_forward(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                                    int64_t window, int64_t shift, double eps);

struct WindowPartitionGradients {
  at::Tensor windows, dx, dgamma, dbeta;
};
WindowPartitionGradients window_partition_forward_backward(const at::Tensor& x, const at::Tensor& gamma,
                                                           const at::Tensor& beta, const at::Tensor& dwindows,
                                                           int64_t window, int64_t shift, double eps);

// shortcut + roll(window_reverse(windows), (shift, shift), (1, 2)).
at::Tensor window_merge_forward(const at::Tensor& windows, const at::Tensor& shortcut, int64_t window, int64_t shift);

struct WindowMergeGradients {
  at::Tensor y, dwindows, dshortcut;
};
WindowMergeGradients window_merge_forward_backward(const at::Tensor& windows, const at::Tensor& shortcut,
                                                   const at::Tensor& dy, int64_t window, int64_t shift);

// layer_norm(cat(x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2], -1)): Swin's
// PatchMerging before its reduction Linear. gamma, beta: [4C].
at::Tensor patch_merging_forward(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps);

struct PatchMergingGradients {
  at::Tensor y, dx, dgamma, dbeta;
};
PatchMergingGradients patch_merging_forward_backward(const at::Tensor& x, const at::Tensor& gamma,
                                                     const at::Tensor& beta, const at::Tensor& dy, double eps);

}  // namespace fusekit::baselines
