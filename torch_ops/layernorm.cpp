// fusekit::layernorm and its backward over kernels/layernorm.h: y = (x - mean) * rstd * gamma + beta
// per row of C; mean and rstd (float, [rows]) are saved for the backward.
#include <torch/library.h>

#include <tuple>

#include "kernels/layernorm.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

constexpr const char* kOp = "layernorm";

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm(const at::Tensor& x, const at::Tensor& gamma,
                                                         const at::Tensor& beta, double eps) {
  check_cuda(x, kOp, "x");
  check_cuda(gamma, kOp, "gamma");
  check_cuda(beta, kOp, "beta");
  const kernels::DType dtype = dtype_of(x, kOp, "x");
  check_same(x, "x", {{&gamma, "gamma"}, {&beta, "beta"}}, kOp);
  TORCH_CHECK_VALUE(x.dim() >= 1, text("fusekit::layernorm: x must have at least one dimension"));
  const int64_t columns = x.size(-1);
  check_numel(gamma, columns, kOp, "gamma");
  check_numel(beta, columns, kOp, "beta");
  const int rows = int_size(columns ? x.numel() / columns : 0, kOp, "rows");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({rows}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  if (rows > 0) {
    kernels::layernorm_forward(dtype, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), y.data_ptr(),
                               mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, int_size(columns, kOp, "C"),
                               static_cast<float>(eps), current_stream(x));
  }
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_backward(const at::Tensor& dy, const at::Tensor& x,
                                                                  const at::Tensor& gamma, const at::Tensor& mean,
                                                                  const at::Tensor& rstd) {
  constexpr const char* op = "layernorm_backward";
  check_cuda(dy, op, "dy");
  check_cuda(x, op, "x");
  check_cuda(gamma, op, "gamma");
  check_cuda(mean, at::kFloat, op, "mean");
  check_cuda(rstd, at::kFloat, op, "rstd");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&dy, "dy"}, {&gamma, "gamma"}}, op);
  TORCH_CHECK_VALUE(dy.sizes() == x.sizes(),
                    text("fusekit::layernorm_backward: dy has shape ", dy.sizes(), " but x has ", x.sizes()));
  const int64_t columns = x.size(-1);
  check_numel(gamma, columns, op, "gamma");
  const int rows = int_size(columns ? x.numel() / columns : 0, op, "rows");
  check_numel(mean, rows, op, "mean");
  check_numel(rstd, rows, op, "rstd");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  at::Tensor dgamma = at::empty_like(gamma);
  at::Tensor dbeta = at::empty_like(gamma);
  if (rows == 0) {
    dgamma.zero_();
    dbeta.zero_();
    return {dx, dgamma, dbeta};
  }
  const int c = int_size(columns, op, "C");
  at::Tensor scratch = workspace(kernels::layernorm_backward_workspace_bytes(rows, c), x);
  kernels::layernorm_backward(dtype, dy.data_ptr(), x.data_ptr(), gamma.data_ptr(), mean.data_ptr<float>(),
                              rstd.data_ptr<float>(), dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), rows, c,
                              scratch.data_ptr(), current_stream(x));
  return {dx, dgamma, dbeta};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("layernorm", &layernorm);
  m.impl("layernorm_backward", &layernorm_backward);
}

}  // namespace fusekit::torch_ops
