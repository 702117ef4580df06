// fusekit::cross_entropy and its backward over kernels/cross_entropy.h: the mean cross-entropy of
// logits [rows, V] against int64 labels [rows] with ignore_index and label smoothing, as
// torch.nn.functional.cross_entropy (reduction "mean") computes it, without materializing the
// probabilities or a float32 copy of the logits. Returns the mean (a float32 scalar), the
// log-sum-exp of each row (float32 [rows]) and the count of rows not ignored (int32 [1]); the
// backward takes the last two and the gradient of the mean.
#include <torch/library.h>

#include <stdexcept>
#include <tuple>

#include "kernels/cross_entropy.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

void check_common(const at::Tensor& logits, const at::Tensor& labels, double label_smoothing, const char* op) {
  check_cuda(logits, op, "logits");
  check_cuda(labels, at::kLong, op, "labels");
  TORCH_CHECK_VALUE(logits.dim() == 2, text("fusekit::", op, ": logits must be [rows, classes], not ", logits.sizes()));
  TORCH_CHECK_VALUE(labels.dim() == 1 && labels.size(0) == logits.size(0),
                    text("fusekit::", op, ": labels must be [", logits.size(0), "], not ", labels.sizes()));
  TORCH_CHECK_VALUE(labels.device() == logits.device(),
                    text("fusekit::", op, ": labels is on ", labels.device(), " but logits on ", logits.device()));
  TORCH_CHECK_VALUE(logits.size(1) >= 1, text("fusekit::", op, ": logits need at least one class"));
  TORCH_CHECK_VALUE(label_smoothing >= 0 && label_smoothing < 1,
                    text("fusekit::", op, ": label_smoothing must be in [0, 1), not ", label_smoothing));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& logits, const at::Tensor& labels,
                                                       int64_t ignore_index, double label_smoothing) {
  constexpr const char* op = "cross_entropy";
  check_common(logits, labels, label_smoothing, op);
  const kernels::DType dtype = dtype_of(logits, op, "logits");
  const int rows = int_size(logits.size(0), op, "rows");
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto f32 = logits.options().dtype(at::kFloat);
  at::Tensor losses = at::empty({rows}, f32), lse = at::empty({rows}, f32), loss = at::empty({}, f32);
  at::Tensor valid = at::empty({1}, logits.options().dtype(at::kInt));
  kernels::cross_entropy_forward(dtype, logits.data_ptr(), labels.data_ptr<int64_t>(), losses.data_ptr<float>(),
                                 lse.data_ptr<float>(), loss.data_ptr<float>(), valid.data_ptr<int>(), rows,
                                 int_size(logits.size(1), op, "classes"), ignore_index,
                                 static_cast<float>(label_smoothing), current_stream(logits));
  return {loss, lse, valid};
}

at::Tensor backward(const at::Tensor& dloss, const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& lse,
                    const at::Tensor& valid, int64_t ignore_index, double label_smoothing) {
  constexpr const char* op = "cross_entropy_backward";
  check_common(logits, labels, label_smoothing, op);
  const kernels::DType dtype = dtype_of(logits, op, "logits");
  check_cuda(dloss, at::kFloat, op, "dloss");
  check_numel(dloss, 1, op, "dloss");
  check_cuda(lse, at::kFloat, op, "lse");
  check_numel(lse, logits.size(0), op, "lse");
  check_cuda(valid, at::kInt, op, "valid");
  check_numel(valid, 1, op, "valid");
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor dlogits = at::empty_like(logits);
  kernels::cross_entropy_backward(dtype, logits.data_ptr(), labels.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                  valid.data_ptr<int>(), dloss.data_ptr<float>(), dlogits.data_ptr(),
                                  int_size(logits.size(0), op, "rows"), int_size(logits.size(1), op, "classes"),
                                  ignore_index, static_cast<float>(label_smoothing), current_stream(logits));
  return dlogits;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("cross_entropy", &forward);
  m.impl("cross_entropy_backward", &backward);
}

}  // namespace fusekit::torch_ops
