// fusekit::bias_gelu and its backward over kernels/bias_gelu.h: y = gelu(x + bias) per row of C,
// approximate "none" (erf, nn.GELU's default) or "tanh".
#include <torch/library.h>

#include <string_view>
#include <tuple>

#include "kernels/bias_gelu.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

// Rows of x [..., C] against a bias [C].
int rows_of(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  TORCH_CHECK_VALUE(x.dim() >= 1, text("fusekit::", op, ": x must have at least one dimension"));
  check_numel(bias, x.size(-1), op, "bias");
  return int_size(x.size(-1) ? x.numel() / x.size(-1) : 0, op, "rows");
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  constexpr const char* op = "bias_gelu";
  check_cuda(x, op, "x");
  check_cuda(bias, op, "bias");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&bias, "bias"}}, op);
  const auto form = gelu_approximation_of(std::string_view(approximate.data(), approximate.size()), op);
  const int rows = rows_of(x, bias, op);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  if (rows > 0) {
    kernels::bias_gelu_forward(dtype, form, x.data_ptr(), bias.data_ptr(), y.data_ptr(), rows,
                               int_size(x.size(-1), op, "C"), current_stream(x));
  }
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias,
                                                      c10::string_view approximate) {
  constexpr const char* op = "bias_gelu_backward";
  check_cuda(dy, op, "dy");
  check_cuda(x, op, "x");
  check_cuda(bias, op, "bias");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&dy, "dy"}, {&bias, "bias"}}, op);
  TORCH_CHECK_VALUE(dy.sizes() == x.sizes(),
                    text("fusekit::bias_gelu_backward: dy has shape ", dy.sizes(), " but x has ", x.sizes()));
  const auto form = gelu_approximation_of(std::string_view(approximate.data(), approximate.size()), op);
  const int rows = rows_of(x, bias, op);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  at::Tensor dbias = at::empty_like(bias);
  if (rows == 0) return {dx, dbias.zero_()};
  const int c = int_size(x.size(-1), op, "C");
  at::Tensor scratch = workspace(kernels::bias_gelu_backward_workspace_bytes(rows, c), x);
  kernels::bias_gelu_backward(dtype, form, dy.data_ptr(), x.data_ptr(), bias.data_ptr(), dx.data_ptr(),
                              dbias.data_ptr(), rows, c, scratch.data_ptr(), current_stream(x));
  return {dx, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("bias_gelu", &bias_gelu);
  m.impl("bias_gelu_backward", &bias_gelu_backward);
}

}  // namespace fusekit::torch_ops
