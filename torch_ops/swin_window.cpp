// fusekit::window_partition, window_merge, patch_merging and their backwards over
// kernels/swin_window.h: Swin's LayerNorm + cyclic shift + window partition, window reverse +
// reverse shift + residual add, and patch merging's 2x2 gather + LayerNorm. Tokens are
// channels-last [B, H, W, C]; windows [B * nW, window * window, C].
#include <torch/library.h>

#include <stdexcept>
#include <tuple>

#include "kernels/swin_window.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

kernels::WindowShape window_shape(const at::Tensor& x, int64_t window, int64_t shift, const char* op) {
  TORCH_CHECK_VALUE(x.dim() == 4, text("fusekit::", op, ": the tokens must be [B, H, W, C], not ", x.sizes()));
  kernels::WindowShape shape{int_size(x.size(0), op, "B"),   int_size(x.size(1), op, "H"),
                             int_size(x.size(2), op, "W"),   int_size(x.size(3), op, "C"),
                             int_size(window, op, "window"), int_size(shift, op, "shift")};
  try {
    kernels::check_window_shape(op, shape);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  return shape;
}

int64_t windows_of(const kernels::WindowShape& s) {
  return static_cast<int64_t>(s.batch) * (s.height / s.window) * (s.width / s.window);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> partition(const at::Tensor& x, const at::Tensor& gamma,
                                                         const at::Tensor& beta, int64_t window, int64_t shift,
                                                         double eps) {
  constexpr const char* op = "window_partition";
  check_cuda(x, op, "x");
  check_cuda(gamma, op, "gamma");
  check_cuda(beta, op, "beta");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&gamma, "gamma"}, {&beta, "beta"}}, op);
  const kernels::WindowShape shape = window_shape(x, window, shift, op);
  check_numel(gamma, shape.channels, op, "gamma");
  check_numel(beta, shape.channels, op, "beta");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor windows = at::empty({windows_of(shape), window * window, shape.channels}, x.options());
  at::Tensor mean = at::empty({shape.tokens()}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({shape.tokens()}, x.options().dtype(at::kFloat));
  if (shape.tokens() > 0) {
    kernels::window_partition_forward(dtype, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), windows.data_ptr(),
                                      mean.data_ptr<float>(), rstd.data_ptr<float>(), shape, static_cast<float>(eps),
                                      current_stream(x));
  }
  return {windows, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> partition_backward(const at::Tensor& dwindows, const at::Tensor& x,
                                                                  const at::Tensor& gamma, const at::Tensor& mean,
                                                                  const at::Tensor& rstd, int64_t window,
                                                                  int64_t shift) {
  constexpr const char* op = "window_partition_backward";
  check_cuda(dwindows, op, "dwindows");
  check_cuda(x, op, "x");
  check_cuda(gamma, op, "gamma");
  check_cuda(mean, at::kFloat, op, "mean");
  check_cuda(rstd, at::kFloat, op, "rstd");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&dwindows, "dwindows"}, {&gamma, "gamma"}}, op);
  const kernels::WindowShape shape = window_shape(x, window, shift, op);
  check_numel(dwindows, x.numel(), op, "dwindows");
  check_numel(gamma, shape.channels, op, "gamma");
  check_numel(mean, shape.tokens(), op, "mean");
  check_numel(rstd, shape.tokens(), op, "rstd");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x), dgamma = at::empty_like(gamma), dbeta = at::empty_like(gamma);
  if (shape.tokens() == 0) return {dx, dgamma.zero_(), dbeta.zero_()};
  at::Tensor scratch = workspace(kernels::window_partition_backward_workspace_bytes(shape), x);
  kernels::window_partition_backward(dtype, dwindows.data_ptr(), x.data_ptr(), gamma.data_ptr(), mean.data_ptr<float>(),
                                     rstd.data_ptr<float>(), dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), shape,
                                     scratch.data_ptr(), current_stream(x));
  return {dx, dgamma, dbeta};
}

at::Tensor merge(const at::Tensor& windows, const at::Tensor& shortcut, int64_t window, int64_t shift) {
  constexpr const char* op = "window_merge";
  check_cuda(windows, op, "windows");
  check_cuda(shortcut, op, "shortcut");
  const kernels::DType dtype = dtype_of(shortcut, op, "shortcut");
  check_same(shortcut, "shortcut", {{&windows, "windows"}}, op);
  const kernels::WindowShape shape = window_shape(shortcut, window, shift, op);
  check_numel(windows, shortcut.numel(), op, "windows");
  const c10::cuda::CUDAGuard guard(shortcut.device());
  at::Tensor y = at::empty_like(shortcut);
  if (shape.tokens() > 0) {
    kernels::window_merge_forward(dtype, windows.data_ptr(), shortcut.data_ptr(), y.data_ptr(), shape,
                                  current_stream(shortcut));
  }
  return y;
}

// dwindows from dy [B, H, W, C]; the shortcut's gradient is dy itself.
at::Tensor merge_backward(const at::Tensor& dy, int64_t window, int64_t shift) {
  constexpr const char* op = "window_merge_backward";
  check_cuda(dy, op, "dy");
  const kernels::DType dtype = dtype_of(dy, op, "dy");
  const kernels::WindowShape shape = window_shape(dy, window, shift, op);
  const c10::cuda::CUDAGuard guard(dy.device());
  at::Tensor dwindows = at::empty({windows_of(shape), window * window, shape.channels}, dy.options());
  if (shape.tokens() > 0) {
    kernels::window_merge_backward(dtype, dy.data_ptr(), dwindows.data_ptr(), shape, current_stream(dy));
  }
  return dwindows;
}

kernels::PatchShape patch_shape(const at::Tensor& x, const char* op) {
  TORCH_CHECK_VALUE(x.dim() == 4, text("fusekit::", op, ": x must be [B, H, W, C], not ", x.sizes()));
  kernels::PatchShape shape{int_size(x.size(0), op, "B"), int_size(x.size(1), op, "H"), int_size(x.size(2), op, "W"),
                            int_size(x.size(3), op, "C")};
  try {
    kernels::check_patch_shape(shape);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  return shape;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> patch_merging(const at::Tensor& x, const at::Tensor& gamma,
                                                             const at::Tensor& beta, double eps) {
  constexpr const char* op = "patch_merging";
  check_cuda(x, op, "x");
  check_cuda(gamma, op, "gamma");
  check_cuda(beta, op, "beta");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&gamma, "gamma"}, {&beta, "beta"}}, op);
  const kernels::PatchShape shape = patch_shape(x, op);
  check_numel(gamma, 4 * x.size(3), op, "gamma");
  check_numel(beta, 4 * x.size(3), op, "beta");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), x.size(1) / 2, x.size(2) / 2, 4 * x.size(3)}, x.options());
  at::Tensor mean = at::empty({shape.merged_tokens()}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({shape.merged_tokens()}, x.options().dtype(at::kFloat));
  if (shape.merged_tokens() > 0) {
    kernels::patch_merging_forward(dtype, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), y.data_ptr(),
                                   mean.data_ptr<float>(), rstd.data_ptr<float>(), shape, static_cast<float>(eps),
                                   current_stream(x));
  }
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> patch_merging_backward(const at::Tensor& dy, const at::Tensor& x,
                                                                      const at::Tensor& gamma, const at::Tensor& mean,
                                                                      const at::Tensor& rstd) {
  constexpr const char* op = "patch_merging_backward";
  check_cuda(dy, op, "dy");
  check_cuda(x, op, "x");
  check_cuda(gamma, op, "gamma");
  check_cuda(mean, at::kFloat, op, "mean");
  check_cuda(rstd, at::kFloat, op, "rstd");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&dy, "dy"}, {&gamma, "gamma"}}, op);
  const kernels::PatchShape shape = patch_shape(x, op);
  check_numel(dy, x.numel(), op, "dy");
  check_numel(gamma, 4 * x.size(3), op, "gamma");
  check_numel(mean, shape.merged_tokens(), op, "mean");
  check_numel(rstd, shape.merged_tokens(), op, "rstd");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x), dgamma = at::empty_like(gamma), dbeta = at::empty_like(gamma);
  if (shape.merged_tokens() == 0) return {dx, dgamma.zero_(), dbeta.zero_()};
  at::Tensor scratch = workspace(kernels::patch_merging_backward_workspace_bytes(shape), x);
  kernels::patch_merging_backward(dtype, dy.data_ptr(), x.data_ptr(), gamma.data_ptr(), mean.data_ptr<float>(),
                                  rstd.data_ptr<float>(), dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), shape,
                                  scratch.data_ptr(), current_stream(x));
  return {dx, dgamma, dbeta};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("window_partition", &partition);
  m.impl("window_partition_backward", &partition_backward);
  m.impl("window_merge", &merge);
  m.impl("window_merge_backward", &merge_backward);
  m.impl("patch_merging", &patch_merging);
  m.impl("patch_merging_backward", &patch_merging_backward);
}

}  // namespace fusekit::torch_ops
