#include "baselines/swin_window.h"

#include <torch/torch.h>

namespace fusekit::baselines {
namespace {

at::Tensor partition_composition(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, int64_t window,
                                 int64_t shift, double eps) {
  at::Tensor y = at::layer_norm(x, {x.size(-1)}, gamma, beta, eps);
  if (shift > 0) y = at::roll(y, {-shift, -shift}, {1, 2});
  return window_partition(y, window);
}

at::Tensor merge_composition(const at::Tensor& windows, const at::Tensor& shortcut, int64_t window, int64_t shift) {
  at::Tensor z = window_reverse(windows, window, shortcut.size(0), shortcut.size(1), shortcut.size(2));
  if (shift > 0) z = at::roll(z, {shift, shift}, {1, 2});
  return shortcut + z;
}

at::Tensor patch_composition(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  const int64_t H = x.size(1), W = x.size(2);
  const at::Tensor x0 = x.slice(1, 0, H, 2).slice(2, 0, W, 2);
  const at::Tensor x1 = x.slice(1, 1, H, 2).slice(2, 0, W, 2);
  const at::Tensor x2 = x.slice(1, 0, H, 2).slice(2, 1, W, 2);
  const at::Tensor x3 = x.slice(1, 1, H, 2).slice(2, 1, W, 2);
  const at::Tensor merged = at::cat({x0, x1, x2, x3}, -1);
  return at::layer_norm(merged, {merged.size(-1)}, gamma, beta, eps);
}

}  // namespace

at::Tensor window_partition(const at::Tensor& x, int64_t window) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  return x.view({B, H / window, window, W / window, window, C})
      .permute({0, 1, 3, 2, 4, 5})
      .contiguous()
      .view({-1, window * window, C});
}

at::Tensor window_reverse(const at::Tensor& windows, int64_t window, int64_t batch, int64_t height, int64_t width) {
  const int64_t C = windows.size(-1);
  return windows.view({batch, height / window, width / window, window, window, C})
      .permute({0, 1, 3, 2, 4, 5})
      .contiguous()
      .view({batch, height, width, C});
}

at::Tensor window_partition_forward(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                                    int64_t window, int64_t shift, double eps) {
  torch::NoGradGuard no_grad;
  return partition_composition(x, gamma, beta, window, shift, eps);
}

WindowPartitionGradients window_partition_forward_backward(const at::Tensor& x, const at::Tensor& gamma,
                                                           const at::Tensor& beta, const at::Tensor& dwindows,
                                                           int64_t window, int64_t shift, double eps) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor gv = gamma.detach().requires_grad_(true);
  at::Tensor bv = beta.detach().requires_grad_(true);
  at::Tensor windows = partition_composition(xv, gv, bv, window, shift, eps);
  windows.backward(dwindows);
  return {windows.detach(), xv.grad(), gv.grad(), bv.grad()};
}

at::Tensor window_merge_forward(const at::Tensor& windows, const at::Tensor& shortcut, int64_t window, int64_t shift) {
  torch::NoGradGuard no_grad;
  return merge_composition(windows, shortcut, window, shift);
}

WindowMergeGradients window_merge_forward_backward(const at::Tensor& windows, const at::Tensor& shortcut,
                                                   const at::Tensor& dy, int64_t window, int64_t shift) {
  at::Tensor wv = windows.detach().requires_grad_(true);
  at::Tensor sv = shortcut.detach().requires_grad_(true);
  at::Tensor y = merge_composition(wv, sv, window, shift);
  y.backward(dy);
  return {y.detach(), wv.grad(), sv.grad()};
}

at::Tensor patch_merging_forward(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  torch::NoGradGuard no_grad;
  return patch_composition(x, gamma, beta, eps);
}

PatchMergingGradients patch_merging_forward_backward(const at::Tensor& x, const at::Tensor& gamma,
                                                     const at::Tensor& beta, const at::Tensor& dy, double eps) {
  at::Tensor xv = x.detach().requires_grad_(true);
  at::Tensor gv = gamma.detach().requires_grad_(true);
  at::Tensor bv = beta.detach().requires_grad_(true);
  at::Tensor y = patch_composition(xv, gv, bv, eps);
  y.backward(dy);
  return {y.detach(), xv.grad(), gv.grad(), bv.grad()};
}

}  // namespace fusekit::baselines
