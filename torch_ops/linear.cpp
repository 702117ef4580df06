// fusekit::linear and its backward over kernels/linear.h: torch.nn.Linear as cuBLASLt GEMMs with a
// fused epilogue, y = x W^T + b ("bias") or y = gelu(x W^T + b) ("bias_gelu", the tanh form that
// cuBLASLt computes; the pre-activation is returned for the backward). x [..., K], weight [N, K],
// bias [N], one storage type; bias_gelu needs N % 8 == 0 (cuBLASLt's aux matrix). The GEMMs run on
// the device's shared context (torch_ops/linear_context.h).
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <tuple>

#include "kernels/bias_gelu.h"
#include "kernels/linear.h"
#include "torch_ops/linear_context.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {

std::mutex& linear_context_mutex() {
  static std::mutex m;
  return m;
}

kernels::LinearContext& linear_context_for(int device) {
  static std::map<int, std::unique_ptr<kernels::LinearContext>> contexts;
  auto& c = contexts[device];
  if (!c) c = std::make_unique<kernels::LinearContext>();
  return *c;
}

namespace {

kernels::LinearEpilogue epilogue_of(std::string_view name, const char* op) {
  if (name == "bias") return kernels::LinearEpilogue::bias;
  if (name == "bias_gelu") return kernels::LinearEpilogue::bias_gelu;
  TORCH_CHECK_VALUE(false, text("fusekit::", op, ": epilogue must be 'bias' or 'bias_gelu', not '", name, "'"));
}

struct Checked {
  kernels::DType dtype;
  kernels::LinearShape shape;
  kernels::LinearEpilogue epilogue;
};

Checked check(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, std::string_view epilogue,
              const char* op) {
  check_cuda(x, op, "x");
  check_cuda(weight, op, "weight");
  check_cuda(bias, op, "bias");
  const kernels::DType dtype = dtype_of(x, op, "x");
  check_same(x, "x", {{&weight, "weight"}, {&bias, "bias"}}, op);
  TORCH_CHECK_VALUE(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
                    text("fusekit::", op, ": weight must be [N, ", x.size(-1), "], not ", weight.sizes()));
  check_numel(bias, weight.size(0), op, "bias");
  kernels::LinearShape shape;
  shape.rows = int_size(x.size(-1) ? x.numel() / x.size(-1) : 0, op, "rows");
  shape.out_features = int_size(weight.size(0), op, "N");
  shape.in_features = int_size(weight.size(1), op, "K");
  const kernels::LinearEpilogue e = epilogue_of(epilogue, op);
  TORCH_CHECK_VALUE(e != kernels::LinearEpilogue::bias_gelu || shape.out_features % 8 == 0,
                    text("fusekit::", op, ": bias_gelu needs N a multiple of 8, not ", shape.out_features));
  TORCH_CHECK_VALUE(
      shape.rows > 0 && shape.out_features > 0 && shape.in_features > 0,
      text("fusekit::", op, ": empty operands (", shape.rows, "x", shape.out_features, "x", shape.in_features, ")"));
  return {dtype, shape, e};
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> s = x.sizes().vec();
  s.back() = n;
  return s;
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                           c10::string_view epilogue) {
  constexpr const char* op = "linear";
  const Checked c = check(x, weight, bias, std::string_view(epilogue.data(), epilogue.size()), op);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty(out_shape(x, weight.size(0)), x.options());
  at::Tensor pre = c.epilogue == kernels::LinearEpilogue::bias_gelu ? at::empty_like(y) : at::empty({0}, x.options());
  const std::lock_guard<std::mutex> lock(linear_context_mutex());
  try {
    kernels::linear_forward(linear_context_for(x.device().index()), c.dtype, c.epilogue, c.shape, x.data_ptr(),
                            weight.data_ptr(), bias.data_ptr(), y.data_ptr(), pre.numel() ? pre.data_ptr() : nullptr,
                            current_stream(x));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::linear: ", e.what()));
  }
  return {y, pre};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& weight, const at::Tensor& pre,
                                                        c10::string_view epilogue) {
  constexpr const char* op = "linear_backward";
  const at::Tensor bias_like = at::empty({weight.size(0)}, weight.options());
  const Checked c = check(x, weight, bias_like, std::string_view(epilogue.data(), epilogue.size()), op);
  check_cuda(dy, op, "dy");
  check_same(x, "x", {{&dy, "dy"}}, op);
  check_numel(dy, static_cast<int64_t>(c.shape.rows) * c.shape.out_features, op, "dy");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x), dweight = at::empty_like(weight), dbias = at::empty({weight.size(0)}, x.options());
  const cudaStream_t stream = current_stream(x);
  at::Tensor dpre = dy;
  if (c.epilogue == kernels::LinearEpilogue::bias_gelu) {
    check_cuda(pre, op, "pre");
    check_numel(pre, dy.numel(), op, "pre");
    // gelu'(pre) * dy and its column sums (the bias gradient), with a zero bias: pre already has it.
    dpre = at::empty_like(dy);
    const at::Tensor zero = at::zeros({weight.size(0)}, x.options());
    at::Tensor scratch = workspace(kernels::bias_gelu_backward_workspace_bytes(c.shape.rows, c.shape.out_features), x);
    kernels::bias_gelu_backward(c.dtype, kernels::GeluApproximation::tanh, dy.data_ptr(), pre.data_ptr(),
                                zero.data_ptr(), dpre.data_ptr(), dbias.data_ptr(), c.shape.rows, c.shape.out_features,
                                scratch.data_ptr(), stream);
  }
  const std::lock_guard<std::mutex> lock(linear_context_mutex());
  kernels::linear_backward(linear_context_for(x.device().index()), c.dtype, c.shape, dpre.data_ptr(), x.data_ptr(),
                           weight.data_ptr(), dx.data_ptr(), dweight.data_ptr(),
                           c.epilogue == kernels::LinearEpilogue::bias ? dbias.data_ptr() : nullptr, stream);
  return {dx, dweight, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("linear", &forward);
  m.impl("linear_backward", &backward);
}

}  // namespace fusekit::torch_ops
