// fusekit::softmax and its backward over kernels/softmax.h: scaled softmax of attention scores x
// [batch, heads, queries, keys] over the keys, with mask "none", "causal" (bottom-right aligned)
// or "padding" (keys k >= lengths[b] removed; lengths int32 [batch] on the device). A row with no
// key left gives zeros. Swin's bias mask is not exposed here (window_attention covers it).
#include <torch/library.h>

#include <optional>
#include <string_view>

#include "kernels/softmax.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

kernels::SoftmaxShape shape_of(const at::Tensor& x, const char* op) {
  TORCH_CHECK_VALUE(x.dim() == 4, text("fusekit::", op, ": x must be [batch, heads, queries, keys], not ", x.sizes()));
  return {int_size(x.size(0), op, "batch"), int_size(x.size(1), op, "heads"), int_size(x.size(2), op, "queries"),
          int_size(x.size(3), op, "keys")};
}

at::Tensor forward(const at::Tensor& x, double scale, c10::string_view mask, const std::optional<at::Tensor>& lengths) {
  constexpr const char* op = "softmax";
  check_cuda(x, op, "x");
  const kernels::DType dtype = dtype_of(x, op, "x");
  const kernels::SoftmaxShape shape = shape_of(x, op);
  const std::string_view kind(mask.data(), mask.size());
  kernels::SoftmaxMasking masking;
  if (kind == "none") {
    masking.kind = kernels::SoftmaxMask::none;
  } else if (kind == "causal") {
    masking.kind = kernels::SoftmaxMask::causal;
  } else if (kind == "padding") {
    TORCH_CHECK_VALUE(lengths.has_value(), text("fusekit::softmax: mask 'padding' needs lengths"));
    check_cuda(*lengths, at::kInt, op, "lengths");
    check_numel(*lengths, x.size(0), op, "lengths");
    TORCH_CHECK_VALUE(lengths->device() == x.device(),
                      text("fusekit::softmax: lengths is on ", lengths->device(), " but x on ", x.device()));
    masking.kind = kernels::SoftmaxMask::padding;
    masking.lengths = lengths->data_ptr<int32_t>();
  } else {
    TORCH_CHECK_VALUE(false, text("fusekit::softmax: mask must be 'none', 'causal' or 'padding', not '", kind, "'"));
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  if (x.numel() > 0) {
    kernels::softmax_forward(dtype, x.data_ptr(), y.data_ptr(), shape, static_cast<float>(scale), masking,
                             current_stream(x));
  }
  return y;
}

at::Tensor backward(const at::Tensor& y, const at::Tensor& dy, double scale) {
  constexpr const char* op = "softmax_backward";
  check_cuda(y, op, "y");
  check_cuda(dy, op, "dy");
  const kernels::DType dtype = dtype_of(y, op, "y");
  check_same(y, "y", {{&dy, "dy"}}, op);
  TORCH_CHECK_VALUE(dy.sizes() == y.sizes(),
                    text("fusekit::softmax_backward: dy has shape ", dy.sizes(), " but y has ", y.sizes()));
  const kernels::SoftmaxShape shape = shape_of(y, op);
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor dx = at::empty_like(y);
  if (y.numel() > 0) {
    kernels::softmax_backward(dtype, y.data_ptr(), dy.data_ptr(), dx.data_ptr(), shape, static_cast<float>(scale),
                              current_stream(y));
  }
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("softmax", &forward);
  m.impl("softmax_backward", &backward);
}

}  // namespace fusekit::torch_ops
