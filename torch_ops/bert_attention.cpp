// fusekit::bert_attention and its backward over kernels/bert_attention.h: the attention core of a
// BERT layer with key padding and dropout on the probabilities. qkv [batch, seq, 3, heads, head_dim]
// (what one fused QKV projection writes), lengths int32 [batch] on the device (valid keys of each
// sequence; the rest are padding), out [batch, seq, heads * head_dim], lse float [batch, heads, seq].
// float16 and bfloat16 only; head_dim 32, 64 or 128.
#include <torch/library.h>

#include <stdexcept>
#include <tuple>

#include "kernels/bert_attention.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

struct Checked {
  kernels::DType dtype;
  kernels::BertAttentionShape shape;
  kernels::BertAttentionDropout dropout;
};

Checked check(const at::Tensor& qkv, const at::Tensor& lengths, double scale, double p, const at::Tensor& philox,
              const char* op) {
  check_cuda(qkv, op, "qkv");
  check_cuda(lengths, at::kInt, op, "lengths");
  const kernels::DType dtype = dtype_of(qkv, op, "qkv");
  TORCH_CHECK_VALUE(qkv.dim() == 5 && qkv.size(2) == 3,
                    text("fusekit::", op, ": qkv must be [batch, seq, 3, heads, head_dim], not ", qkv.sizes()));
  TORCH_CHECK_VALUE(lengths.device() == qkv.device(),
                    text("fusekit::", op, ": lengths is on ", lengths.device(), " but qkv on ", qkv.device()));
  check_numel(lengths, qkv.size(0), op, "lengths");
  TORCH_CHECK_VALUE(scale > 0, text("fusekit::", op, ": scale must be positive, not ", scale));
  check_dropout(p, op);
  const PhiloxStream stream = philox_of(philox, qkv, op);
  kernels::BertAttentionShape shape{int_size(qkv.size(0), op, "batch"), int_size(qkv.size(3), op, "heads"),
                                    int_size(qkv.size(1), op, "seq"), int_size(qkv.size(4), op, "head_dim")};
  try {
    kernels::check_bert_attention(dtype, shape, static_cast<float>(p));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  return {dtype, shape,
          kernels::BertAttentionDropout{static_cast<float>(p), stream.seed, stream.offset, stream.counter}};
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& qkv, const at::Tensor& lengths, double scale, double p,
                                           const at::Tensor& philox) {
  constexpr const char* op = "bert_attention";
  const Checked c = check(qkv, lengths, scale, p, philox, op);
  const c10::cuda::CUDAGuard guard(qkv.device());
  at::Tensor out = at::empty({qkv.size(0), qkv.size(1), qkv.size(3) * qkv.size(4)}, qkv.options());
  at::Tensor lse = at::empty({qkv.size(0), qkv.size(3), qkv.size(1)}, qkv.options().dtype(at::kFloat));
  if (qkv.numel() > 0) {
    kernels::bert_attention_forward(c.dtype, qkv.data_ptr(), lengths.data_ptr<int32_t>(), out.data_ptr(),
                                    lse.data_ptr<float>(), c.shape, static_cast<float>(scale), c.dropout,
                                    current_stream(qkv));
  }
  return {out, lse};
}

at::Tensor backward(const at::Tensor& dout, const at::Tensor& qkv, const at::Tensor& lengths, const at::Tensor& out,
                    const at::Tensor& lse, double scale, double p, const at::Tensor& philox) {
  constexpr const char* op = "bert_attention_backward";
  const Checked c = check(qkv, lengths, scale, p, philox, op);
  check_cuda(dout, op, "dout");
  check_cuda(out, op, "out");
  check_cuda(lse, at::kFloat, op, "lse");
  check_same(qkv, "qkv", {{&dout, "dout"}, {&out, "out"}}, op);
  const std::vector<int64_t> out_shape{qkv.size(0), qkv.size(1), qkv.size(3) * qkv.size(4)};
  TORCH_CHECK_VALUE(dout.sizes() == out_shape && out.sizes() == out_shape,
                    text("fusekit::", op, ": dout ", dout.sizes(), " and out ", out.sizes(), " must be ",
                         c10::IntArrayRef(out_shape)));
  check_numel(lse, qkv.size(0) * qkv.size(3) * qkv.size(1), op, "lse");
  const c10::cuda::CUDAGuard guard(qkv.device());
  at::Tensor dqkv = at::empty_like(qkv);
  if (qkv.numel() == 0) return dqkv;
  at::Tensor scratch = workspace(kernels::bert_attention_backward_workspace_bytes(c.shape), qkv);
  kernels::bert_attention_backward(c.dtype, qkv.data_ptr(), lengths.data_ptr<int32_t>(), out.data_ptr(),
                                   lse.data_ptr<float>(), dout.data_ptr(), dqkv.data_ptr(), scratch.data_ptr(), c.shape,
                                   static_cast<float>(scale), c.dropout, current_stream(qkv));
  return dqkv;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("bert_attention", &forward);
  m.impl("bert_attention_backward", &backward);
}

}  // namespace fusekit::torch_ops
