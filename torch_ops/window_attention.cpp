// fusekit::window_attention and its backward over kernels/window_attention.h: Swin's window
// attention with the relative position bias (gathered from its table) and the shifted-window mask,
// one kernel per direction. qkv [windows, tokens, 3, heads, head_dim] (Swin's qkv projection,
// viewed); table [(2 window - 1)^2, heads] in qkv's dtype; index int32 [tokens, tokens] (Swin's
// relative_position_index); mask float32 [mask windows, tokens, tokens] or None; out [windows,
// tokens, heads * head_dim]; bias (float32 [heads, tokens, tokens]) and lse are saved for the
// backward, which also gives the table's gradient. float16 and bfloat16; tokens 49 or 144;
// head_dim 32 or 64.
#include <torch/library.h>

#include <optional>
#include <stdexcept>
#include <tuple>

#include "kernels/window_attention.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

struct Checked {
  kernels::DType dtype;
  kernels::WindowAttentionShape shape;
  const float* mask;
};

Checked check(const at::Tensor& qkv, const at::Tensor& table, const at::Tensor& index,
              const std::optional<at::Tensor>& mask, double scale, const char* op) {
  check_cuda(qkv, op, "qkv");
  check_cuda(table, op, "table");
  check_cuda(index, at::kInt, op, "index");
  const kernels::DType dtype = dtype_of(qkv, op, "qkv");
  check_same(qkv, "qkv", {{&table, "table"}}, op);
  TORCH_CHECK_VALUE(qkv.dim() == 5 && qkv.size(2) == 3,
                    text("fusekit::", op, ": qkv must be [windows, tokens, 3, heads, head_dim], not ", qkv.sizes()));
  const int64_t tokens = qkv.size(1), heads = qkv.size(3);
  TORCH_CHECK_VALUE(index.dim() == 2 && index.size(0) == tokens && index.size(1) == tokens,
                    text("fusekit::", op, ": index must be [", tokens, ", ", tokens, "], not ", index.sizes()));
  // tokens = window^2; the table has an entry per relative offset, (2 window - 1)^2, which the
  // index addresses and the backward writes.
  int64_t window = 1;
  while (window * window < tokens) ++window;
  TORCH_CHECK_VALUE(window * window == tokens,
                    text("fusekit::", op, ": ", tokens, " tokens per window is not a square window"));
  const int64_t entries = (2 * window - 1) * (2 * window - 1);
  TORCH_CHECK_VALUE(table.dim() == 2 && table.size(0) == entries && table.size(1) == heads,
                    text("fusekit::", op, ": table must be [", entries, ", ", heads, "], not ", table.sizes()));
  TORCH_CHECK_VALUE(scale > 0, text("fusekit::", op, ": scale must be positive, not ", scale));
  int mask_windows = 0;
  const float* mask_data = nullptr;
  if (mask.has_value() && mask->defined()) {
    check_cuda(*mask, at::kFloat, op, "mask");
    TORCH_CHECK_VALUE(mask->dim() == 3 && mask->size(1) == tokens && mask->size(2) == tokens && mask->size(0) > 0 &&
                          qkv.size(0) % mask->size(0) == 0,
                      text("fusekit::", op, ": mask must be [mask windows, ", tokens, ", ", tokens,
                           "] with the windows a multiple of its first size, not ", mask->sizes()));
    mask_windows = int_size(mask->size(0), op, "mask windows");
    mask_data = mask->data_ptr<float>();
  }
  kernels::WindowAttentionShape shape{int_size(qkv.size(0), op, "windows"), int_size(heads, op, "heads"),
                                      int_size(tokens, op, "tokens"), int_size(qkv.size(4), op, "head_dim"),
                                      mask_windows};
  try {
    kernels::check_window_attention(dtype, shape);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  return {dtype, shape, mask_data};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& qkv, const at::Tensor& table,
                                                       const at::Tensor& index, const std::optional<at::Tensor>& mask,
                                                       double scale) {
  constexpr const char* op = "window_attention";
  const Checked c = check(qkv, table, index, mask, scale, op);
  const c10::cuda::CUDAGuard guard(qkv.device());
  const auto f32 = qkv.options().dtype(at::kFloat);
  at::Tensor out = at::empty({qkv.size(0), qkv.size(1), qkv.size(3) * qkv.size(4)}, qkv.options());
  at::Tensor bias = at::empty({qkv.size(3), qkv.size(1), qkv.size(1)}, f32);
  at::Tensor lse = at::empty({qkv.size(0), qkv.size(3), qkv.size(1)}, f32);
  if (qkv.numel() > 0) {
    kernels::window_attention_forward(c.dtype, qkv.data_ptr(), table.data_ptr(), index.data_ptr<int32_t>(), c.mask,
                                      out.data_ptr(), bias.data_ptr<float>(), lse.data_ptr<float>(), c.shape,
                                      static_cast<float>(scale), current_stream(qkv));
  }
  return {out, bias, lse};
}

std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& dout, const at::Tensor& qkv, const at::Tensor& table,
                                            const at::Tensor& index, const std::optional<at::Tensor>& mask,
                                            const at::Tensor& out, const at::Tensor& bias, const at::Tensor& lse,
                                            double scale) {
  constexpr const char* op = "window_attention_backward";
  const Checked c = check(qkv, table, index, mask, scale, op);
  check_cuda(dout, op, "dout");
  check_cuda(out, op, "out");
  check_cuda(bias, at::kFloat, op, "bias");
  check_cuda(lse, at::kFloat, op, "lse");
  check_same(qkv, "qkv", {{&dout, "dout"}, {&out, "out"}}, op);
  const int64_t windows = qkv.size(0), tokens = qkv.size(1), heads = qkv.size(3);
  check_numel(dout, windows * tokens * heads * qkv.size(4), op, "dout");
  check_numel(out, windows * tokens * heads * qkv.size(4), op, "out");
  check_numel(bias, heads * tokens * tokens, op, "bias");
  check_numel(lse, windows * heads * tokens, op, "lse");
  const c10::cuda::CUDAGuard guard(qkv.device());
  at::Tensor dqkv = at::empty_like(qkv), dtable = at::empty_like(table);
  if (qkv.numel() == 0) return {dqkv, dtable.zero_()};
  at::Tensor scratch = workspace(kernels::window_attention_backward_workspace_bytes(c.shape), qkv);
  kernels::window_attention_backward(c.dtype, qkv.data_ptr(), bias.data_ptr<float>(), c.mask, out.data_ptr(),
                                     lse.data_ptr<float>(), dout.data_ptr(), index.data_ptr<int32_t>(), dqkv.data_ptr(),
                                     dtable.data_ptr(), scratch.data_ptr(), c.shape, static_cast<float>(scale),
                                     current_stream(qkv));
  return {dqkv, dtable};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("window_attention", &forward);
  m.impl("window_attention_backward", &backward);
}

}  // namespace fusekit::torch_ops
