// fusekit::bias_dropout_residual_layernorm and its backward over
// kernels/bias_dropout_residual_layernorm.h, post-LN (BERT's): y = LayerNorm(residual +
// dropout(x + bias)) per row of C. The backward recomputes the pre-LN sum from x, bias and
// residual and the dropout mask from (seed, offset); dx is the gradient of x (mask applied),
// dresidual that of the residual stream.
#include <torch/library.h>

#include <tuple>

#include "kernels/bias_dropout_residual_layernorm.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

kernels::Dropout dropout_of(double p, const at::Tensor& philox, const at::Tensor& like, const char* op) {
  check_dropout(p, op);
  const PhiloxStream stream = philox_of(philox, like, op);
  return kernels::Dropout{static_cast<float>(p), stream.seed, stream.offset, stream.counter};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& bias,
                                                       const at::Tensor& residual, const at::Tensor& gamma,
                                                       const at::Tensor& beta, double p, const at::Tensor& philox,
                                                       double eps) {
  constexpr const char* op = "bias_dropout_residual_layernorm";
  for (const auto& [t, name] :
       {std::pair{&x, "x"}, {&bias, "bias"}, {&residual, "residual"}, {&gamma, "gamma"}, {&beta, "beta"}}) {
    check_cuda(*t, op, name);
  }
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&bias, "bias"}, {&residual, "residual"}, {&gamma, "gamma"}, {&beta, "beta"}}, op);
  TORCH_CHECK_VALUE(x.dim() >= 1 && residual.sizes() == x.sizes(),
                    text("fusekit::", op, ": residual has shape ", residual.sizes(), " but x has ", x.sizes()));
  const int64_t columns = x.size(-1);
  for (const auto& [t, name] : {std::pair{&bias, "bias"}, {&gamma, "gamma"}, {&beta, "beta"}}) {
    check_numel(*t, columns, op, name);
  }
  const kernels::Dropout dropout = dropout_of(p, philox, x, op);
  const int rows = int_size(columns ? x.numel() / columns : 0, op, "rows");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({rows}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  if (rows > 0) {
    kernels::BiasDropoutResidualForwardTensors t;
    t.x = x.data_ptr();
    t.bias = bias.data_ptr();
    t.residual = residual.data_ptr();
    t.gamma = gamma.data_ptr();
    t.beta = beta.data_ptr();
    t.y = y.data_ptr();
    t.mean = mean.data_ptr<float>();
    t.rstd = rstd.data_ptr<float>();
    kernels::bias_dropout_residual_layernorm_forward(dtype, kernels::ResidualOrder::post_ln, t, dropout, rows,
                                                     int_size(columns, op, "C"), static_cast<float>(eps),
                                                     current_stream(x));
  }
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
    const at::Tensor& gamma, const at::Tensor& mean, const at::Tensor& rstd, double p, const at::Tensor& philox) {
  constexpr const char* op = "bias_dropout_residual_layernorm_backward";
  for (const auto& [t, name] :
       {std::pair{&dy, "dy"}, {&x, "x"}, {&bias, "bias"}, {&residual, "residual"}, {&gamma, "gamma"}}) {
    check_cuda(*t, op, name);
  }
  check_cuda(mean, at::kFloat, op, "mean");
  check_cuda(rstd, at::kFloat, op, "rstd");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&dy, "dy"}, {&bias, "bias"}, {&residual, "residual"}, {&gamma, "gamma"}}, op);
  TORCH_CHECK_VALUE(x.dim() >= 1 && dy.sizes() == x.sizes() && residual.sizes() == x.sizes(),
                    text("fusekit::", op, ": dy ", dy.sizes(), ", x ", x.sizes(), " and residual ", residual.sizes(),
                         " must have one shape"));
  const int64_t columns = x.size(-1);
  check_numel(bias, columns, op, "bias");
  check_numel(gamma, columns, op, "gamma");
  const int rows = int_size(columns ? x.numel() / columns : 0, op, "rows");
  check_numel(mean, rows, op, "mean");
  check_numel(rstd, rows, op, "rstd");
  const kernels::Dropout dropout = dropout_of(p, philox, x, op);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x), dresidual = at::empty_like(x);
  at::Tensor dbias = at::empty_like(bias), dgamma = at::empty_like(gamma), dbeta = at::empty_like(gamma);
  if (rows == 0) return {dx, dresidual, dbias.zero_(), dgamma.zero_(), dbeta.zero_()};
  const int c = int_size(columns, op, "C");
  at::Tensor scratch = workspace(kernels::bias_dropout_residual_layernorm_backward_workspace_bytes(rows, c), x);
  kernels::BiasDropoutResidualBackwardTensors t;
  t.dy = dy.data_ptr();
  t.x = x.data_ptr();
  t.bias = bias.data_ptr();
  t.residual = residual.data_ptr();
  t.gamma = gamma.data_ptr();
  t.mean = mean.data_ptr<float>();
  t.rstd = rstd.data_ptr<float>();
  t.dx = dx.data_ptr();
  t.dresidual = dresidual.data_ptr();
  t.dbias = dbias.data_ptr();
  t.dgamma = dgamma.data_ptr();
  t.dbeta = dbeta.data_ptr();
  kernels::bias_dropout_residual_layernorm_backward(dtype, kernels::ResidualOrder::post_ln, t, dropout, rows, c,
                                                    scratch.data_ptr(), current_stream(x));
  return {dx, dresidual, dbias, dgamma, dbeta};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("bias_dropout_residual_layernorm", &forward);
  m.impl("bias_dropout_residual_layernorm_backward", &backward);
}

}  // namespace fusekit::torch_ops
