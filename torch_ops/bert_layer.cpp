// fusekit::bert_layer and its backward: a whole post-LN BERT encoder layer (Hugging Face's BertLayer:
// self-attention with key padding, output projection, FFN with GELU, two residual LayerNorms) as one
// op, over the same kernels as the fused C++ step (models/bert_fused.h). One op and one autograd node
// per layer instead of about twenty: a patched model's eager step is bound by the host's cost per op
// and per node, not by the GPU (evidence/h100/notes/torch_patch.md), and LightSeq2's layer-level
// operators are built the same way.
//
// x [batch, seq, H] in the compute dtype (float16 or bfloat16); lengths int32 [batch] on the device
// (valid keys per sequence, padding on the right); params: the layer's 16 tensors in Hugging Face's
// order and shapes, in any floating dtype (float32 under autocast):
//   0-5  query, key, value: weight [H, H], bias [H] each    6-7  attention output dense [H, H], [H]
//   8-9  attention output LayerNorm gamma, beta [H]        10-11 intermediate dense [I, H], [I]
//   12-13 output dense [H, I], [H]                          14-15 output LayerNorm gamma, beta [H]
// The forward casts them once into one flat buffer of the compute dtype (the query, key and value
// rows packed as one [3H, H] projection, whose output is the [tokens, 3, heads, head_dim] layout the
// attention reads), returned among `saved` for the backward. The backward returns each parameter's
// gradient in that parameter's dtype.
//
// Per layer (N = batch x seq tokens):
//   qkv = x Wqkv^T + bqkv                         cuBLASLt, bias epilogue
//   context = attention(qkv, lengths)             kernels/bert_attention.h (dropout p_attention)
//   dense = context Wo^T                          cuBLASLt; its bias goes to the next kernel
//   a = LN1(x + dropout(dense + bo))              kernels/bias_dropout_residual_layernorm.h
//   up = a W1^T; g = gelu(up + b1)                cuBLASLt; kernels/bias_gelu.h (exact or tanh form)
//   down = g W2^T; y = LN2(a + dropout(down + b2))
// saved (in this order): packed params, qkv, context, lse, dense, a, mean1, rstd1, up, g, down, mean2,
// rstd2. The three dropout sites draw from keys derived from the call's one Philox (seed, offset).
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/bert_attention.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/bias_gelu.h"
#include "kernels/linear.h"
#include "torch_ops/linear_context.h"
#include "torch_ops/packed_params.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

constexpr int kParams = 16;
constexpr int kSaved = 13;

// SplitMix64's finalizer: the Philox key of one dropout site from the call's key.
uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Layer {
  kernels::DType dtype;
  int batch, seq, tokens, hidden, intermediate, heads;
  kernels::GeluApproximation approximation;
  kernels::BertAttentionDropout attention;
  kernels::Dropout attention_output, output;
  // Offsets of the 16 parameters (in elements) in the packed buffer, and its size.
  int64_t offset[kParams];
  int64_t packed_elements;
};

// The parameters' expected shapes, in the order above.
std::vector<std::vector<int64_t>> parameter_shapes(int64_t h, int64_t i) {
  return {{h, h}, {h}, {h, h}, {h}, {h, h}, {h}, {h, h}, {h}, {h}, {h}, {i, h}, {i}, {h, i}, {h}, {h}, {h}};
}

// Where each parameter lives in the packed buffer: the query, key and value weights as the rows of
// one [3H, H] weight, their biases as one [3H] bias, then the others in order.
void pack_offsets(Layer& l) {
  const int64_t h = l.hidden, i = l.intermediate;
  l.offset[0] = 0;                  // query weight: rows 0 .. H-1 of Wqkv
  l.offset[2] = h * h;              // key weight
  l.offset[4] = 2 * h * h;          // value weight
  l.offset[1] = 3 * h * h;          // query bias: bqkv[0 .. H-1]
  l.offset[3] = 3 * h * h + h;      // key bias
  l.offset[5] = 3 * h * h + 2 * h;  // value bias
  int64_t at = 3 * h * h + 3 * h;
  const std::vector<std::vector<int64_t>> shapes = parameter_shapes(h, i);
  for (int k = 6; k < kParams; ++k) {
    l.offset[k] = at;
    int64_t n = 1;
    for (int64_t d : shapes[k]) n *= d;
    at += n;
  }
  l.packed_elements = at;
}

Layer check(const at::Tensor& x, const at::Tensor& lengths, at::TensorList params, int64_t heads, double scale,
            double p_attention, double p_attention_output, double p_output, const at::Tensor& philox,
            std::string_view approximate, const char* op) {
  check_cuda(x, op, "x");
  check_cuda(lengths, at::kInt, op, "lengths");
  const kernels::DType dtype = dtype_of(x, op, "x");
  TORCH_CHECK_TYPE(dtype != kernels::DType::f32,
                   text("fusekit::", op, ": x must be float16 or bfloat16 (the compute dtype), not float32"));
  TORCH_CHECK_VALUE(x.dim() == 3, text("fusekit::", op, ": x must be [batch, seq, hidden], not ", x.sizes()));
  TORCH_CHECK_VALUE(lengths.device() == x.device(),
                    text("fusekit::", op, ": lengths is on ", lengths.device(), " but x on ", x.device()));
  check_numel(lengths, x.size(0), op, "lengths");
  TORCH_CHECK_VALUE(static_cast<int>(params.size()) == kParams,
                    text("fusekit::", op, ": params must hold the layer's 16 tensors, not ", params.size()));
  const int64_t h = x.size(2);
  TORCH_CHECK_VALUE(heads > 0 && h % heads == 0,
                    text("fusekit::", op, ": hidden size ", h, " is not a multiple of heads ", heads));
  const int64_t i = params[10].dim() == 2 ? params[10].size(0) : -1;
  const std::vector<std::vector<int64_t>> shapes = parameter_shapes(h, i);
  check_params(params, shapes, x, op, [&] { return text("hidden ", h, ", intermediate ", i); });
  TORCH_CHECK_VALUE(scale > 0, text("fusekit::", op, ": scale must be positive, not ", scale));
  check_dropout(p_attention, op);
  check_dropout(p_attention_output, op);
  check_dropout(p_output, op);
  const PhiloxStream stream = philox_of(philox, x, op);
  Layer l;
  l.dtype = dtype;
  l.batch = int_size(x.size(0), op, "batch");
  l.seq = int_size(x.size(1), op, "seq");
  l.tokens = int_size(x.size(0) * x.size(1), op, "tokens");
  l.hidden = int_size(h, op, "hidden");
  l.intermediate = int_size(i, op, "intermediate");
  l.heads = static_cast<int>(heads);
  l.approximation = gelu_approximation_of(approximate, op);
  TORCH_CHECK_VALUE(l.tokens > 0, text("fusekit::", op, ": x is empty (", x.sizes(), ")"));
  try {
    kernels::check_bert_attention(dtype, {l.batch, l.heads, l.seq, l.hidden / l.heads},
                                  static_cast<float>(p_attention));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  l.attention = {static_cast<float>(p_attention), mix(stream.seed ^ 1u), stream.offset, stream.counter};
  l.attention_output = {static_cast<float>(p_attention_output), mix(stream.seed ^ 2u), stream.offset, stream.counter};
  l.output = {static_cast<float>(p_output), mix(stream.seed ^ 3u), stream.offset, stream.counter};
  pack_offsets(l);
  return l;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> forward(const at::Tensor& x, const at::Tensor& lengths,
                                                        at::TensorList params, int64_t heads, double scale,
                                                        double p_attention, double p_attention_output, double p_output,
                                                        const at::Tensor& philox, double eps,
                                                        c10::string_view approximate) {
  constexpr const char* op = "bert_layer";
  const Layer l = check(x, lengths, params, heads, scale, p_attention, p_attention_output, p_output, philox,
                        std::string_view(approximate.data(), approximate.size()), op);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x);
  const int N = l.tokens, H = l.hidden, I = l.intermediate;
  const auto options = x.options();
  const auto stats = options.dtype(at::kFloat);
  // The parameters in the compute dtype, once per call (copy_ casts).
  at::Tensor packed = at::empty({l.packed_elements}, options);
  for (int k = 0; k < kParams; ++k) pack_into(packed, l.offset[k], params[k]);
  auto P = [&](int k) { return element_at(packed, l.offset[k]); };
  at::Tensor qkv = at::empty({l.batch, l.seq, 3, l.heads, H / l.heads}, options);
  at::Tensor context = at::empty({l.batch, l.seq, H}, options);
  at::Tensor lse = at::empty({l.batch, l.heads, l.seq}, stats);
  at::Tensor dense = at::empty({N, H}, options), a = at::empty({N, H}, options);
  at::Tensor mean1 = at::empty({N}, stats), rstd1 = at::empty({N}, stats);
  at::Tensor up = at::empty({N, I}, options), g = at::empty({N, I}, options), down = at::empty({N, H}, options);
  at::Tensor y = at::empty_like(x);
  at::Tensor mean2 = at::empty({N}, stats), rstd2 = at::empty({N}, stats);
  const kernels::BertAttentionShape shape{l.batch, l.heads, l.seq, H / l.heads};
  const float e = static_cast<float>(eps);
  {
    const std::lock_guard<std::mutex> lock(linear_context_mutex());
    kernels::LinearContext& gemm = linear_context_for(x.device().index());
    kernels::linear_forward(gemm, l.dtype, kernels::LinearEpilogue::bias, {N, 3 * H, H, false}, x.data_ptr(), P(0),
                            P(1), qkv.data_ptr(), nullptr, stream);
    kernels::bert_attention_forward(l.dtype, qkv.data_ptr(), lengths.data_ptr<int32_t>(), context.data_ptr(),
                                    lse.data_ptr<float>(), shape, static_cast<float>(scale), l.attention, stream);
    kernels::linear_forward_no_bias(gemm, l.dtype, {N, H, H, false}, context.data_ptr(), P(6), dense.data_ptr(),
                                    stream);
    kernels::BiasDropoutResidualForwardTensors t1;
    t1.x = dense.data_ptr();
    t1.bias = P(7);
    t1.residual = x.data_ptr();
    t1.gamma = P(8);
    t1.beta = P(9);
    t1.y = a.data_ptr();
    t1.mean = mean1.data_ptr<float>();
    t1.rstd = rstd1.data_ptr<float>();
    kernels::bias_dropout_residual_layernorm_forward(l.dtype, kernels::ResidualOrder::post_ln, t1, l.attention_output,
                                                     N, H, e, stream);
    kernels::linear_forward_no_bias(gemm, l.dtype, {N, I, H, false}, a.data_ptr(), P(10), up.data_ptr(), stream);
    kernels::bias_gelu_forward(l.dtype, l.approximation, up.data_ptr(), P(11), g.data_ptr(), N, I, stream);
    kernels::linear_forward_no_bias(gemm, l.dtype, {N, H, I, false}, g.data_ptr(), P(12), down.data_ptr(), stream);
    kernels::BiasDropoutResidualForwardTensors t2;
    t2.x = down.data_ptr();
    t2.bias = P(13);
    t2.residual = a.data_ptr();
    t2.gamma = P(14);
    t2.beta = P(15);
    t2.y = y.data_ptr();
    t2.mean = mean2.data_ptr<float>();
    t2.rstd = rstd2.data_ptr<float>();
    kernels::bias_dropout_residual_layernorm_forward(l.dtype, kernels::ResidualOrder::post_ln, t2, l.output, N, H, e,
                                                     stream);
  }
  return {y, {packed, qkv, context, lse, dense, a, mean1, rstd1, up, g, down, mean2, rstd2}};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> backward(const at::Tensor& dy, const at::Tensor& x,
                                                         const at::Tensor& lengths, at::TensorList params,
                                                         at::TensorList saved, int64_t heads, double scale,
                                                         double p_attention, double p_attention_output, double p_output,
                                                         const at::Tensor& philox, c10::string_view approximate) {
  constexpr const char* op = "bert_layer_backward";
  const Layer l = check(x, lengths, params, heads, scale, p_attention, p_attention_output, p_output, philox,
                        std::string_view(approximate.data(), approximate.size()), op);
  check_cuda(dy, op, "dy");
  check_same(x, "x", {{&dy, "dy"}}, op);
  TORCH_CHECK_VALUE(dy.sizes() == x.sizes(),
                    text("fusekit::", op, ": dy has shape ", dy.sizes(), " but x has ", x.sizes()));
  TORCH_CHECK_VALUE(static_cast<int>(saved.size()) == kSaved,
                    text("fusekit::", op, ": saved must hold the forward's 13 tensors, not ", saved.size()));
  const int N = l.tokens, H = l.hidden, I = l.intermediate;
  // What the forward returned, checked for size and dtype (a stale or foreign list never reaches a kernel).
  const std::vector<int64_t> expected[kSaved] = {{l.packed_elements},
                                                 {l.batch, l.seq, 3, l.heads, H / l.heads},
                                                 {l.batch, l.seq, H},
                                                 {l.batch, l.heads, l.seq},
                                                 {N, H},
                                                 {N, H},
                                                 {N},
                                                 {N},
                                                 {N, I},
                                                 {N, I},
                                                 {N, H},
                                                 {N},
                                                 {N}};
  for (int k = 0; k < kSaved; ++k) {
    const std::string name = "saved[" + std::to_string(k) + "]";
    const bool statistic = k == 3 || k == 6 || k == 7 || k == 11 || k == 12;
    check_cuda(saved[k], statistic ? at::kFloat : x.scalar_type(), op, name.c_str());
    TORCH_CHECK_VALUE(saved[k].sizes() == c10::IntArrayRef(expected[k]) && saved[k].device() == x.device(),
                      text("fusekit::", op, ": ", name, " has shape ", saved[k].sizes(), " on ", saved[k].device(),
                           ", expected ", c10::IntArrayRef(expected[k]), " on ", x.device()));
  }
  const at::Tensor &packed = saved[0], &qkv = saved[1], &context = saved[2], &lse = saved[3], &dense = saved[4],
                   &a = saved[5], &mean1 = saved[6], &rstd1 = saved[7], &up = saved[8], &g = saved[9],
                   &down = saved[10], &mean2 = saved[11], &rstd2 = saved[12];
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x);
  const auto options = x.options();
  auto P = [&](int k) { return element_at(packed, l.offset[k]); };
  // The gradients in the compute dtype, in the packed layout; cast to each parameter's dtype at the end.
  at::Tensor dpacked = at::empty({l.packed_elements}, options);
  auto D = [&](int k) { return element_at(dpacked, l.offset[k]); };
  at::Tensor h1 = at::empty({N, H}, options), h2 = at::empty({N, H}, options);
  at::Tensor dg = at::empty({N, I}, options), dup = at::empty({N, I}, options);
  at::Tensor dx = at::empty_like(x), dcontext = at::empty({N, H}, options), dqkv = at::empty_like(qkv);
  const kernels::BertAttentionShape shape{l.batch, l.heads, l.seq, H / l.heads};
  const size_t scratch_bytes = std::max({kernels::bias_dropout_residual_layernorm_backward_workspace_bytes(N, H),
                                         kernels::bias_gelu_backward_workspace_bytes(N, I),
                                         kernels::bert_attention_backward_workspace_bytes(shape)});
  at::Tensor scratch = workspace(scratch_bytes, x);
  const at::Tensor dy_ = dy.contiguous();
  // The backward of one of the layer's two post-LN "bias + dropout + residual + LayerNorm" blocks,
  // from the gradient of its output, its input (to recompute h), residual and saved statistics;
  // parameters k, k + 1 and k + 2 are its bias, gamma and beta (their gradients go to dpacked).
  auto layernorm_backward = [&](const void* dout, const at::Tensor& input, const at::Tensor& residual, int k,
                                const at::Tensor& mean, const at::Tensor& rstd, const kernels::Dropout& dropout,
                                void* dinput, void* dresidual) {
    kernels::BiasDropoutResidualBackwardTensors t;
    t.dy = dout;
    t.x = input.data_ptr();
    t.bias = P(k);
    t.residual = residual.data_ptr();
    t.gamma = P(k + 1);
    t.mean = mean.data_ptr<float>();
    t.rstd = rstd.data_ptr<float>();
    t.dx = dinput;
    t.dresidual = dresidual;
    t.dbias = D(k);
    t.dgamma = D(k + 1);
    t.dbeta = D(k + 2);
    kernels::bias_dropout_residual_layernorm_backward(l.dtype, kernels::ResidualOrder::post_ln, t, dropout, N, H,
                                                      scratch.data_ptr(), stream);
  };
  {
    const std::lock_guard<std::mutex> lock(linear_context_mutex());
    kernels::LinearContext& gemm = linear_context_for(x.device().index());
    // Output LayerNorm: h1 = d down, h2 = d a (the residual branch).
    layernorm_backward(dy_.data_ptr(), down, a, 13, mean2, rstd2, l.output, h1.data_ptr(), h2.data_ptr());
    // FFN: d g = h1 W2, d W2 = h1^T g; d up and d b1 through the GELU; d W1 = dup^T a; d a += dup W1.
    kernels::linear_input_gradient(gemm, l.dtype, {N, H, I, false}, h1.data_ptr(), P(12), dg.data_ptr(), false, stream);
    kernels::linear_weight_gradient(gemm, l.dtype, {N, H, I, false}, h1.data_ptr(), g.data_ptr(), D(12), nullptr, false,
                                    stream);
    kernels::bias_gelu_backward(l.dtype, l.approximation, dg.data_ptr(), up.data_ptr(), P(11), dup.data_ptr(), D(11), N,
                                I, scratch.data_ptr(), stream);
    kernels::linear_weight_gradient(gemm, l.dtype, {N, I, H, false}, dup.data_ptr(), a.data_ptr(), D(10), nullptr,
                                    false, stream);
    kernels::linear_input_gradient(gemm, l.dtype, {N, I, H, false}, dup.data_ptr(), P(10), h2.data_ptr(), true, stream);
    // Attention LayerNorm: h1 = d dense, dx = d x along the residual stream.
    layernorm_backward(h2.data_ptr(), dense, x, 7, mean1, rstd1, l.attention_output, h1.data_ptr(), dx.data_ptr());
    // Output projection, attention, QKV projection; dx += d qkv Wqkv.
    kernels::linear_backward(gemm, l.dtype, {N, H, H, false}, h1.data_ptr(), context.data_ptr(), P(6),
                             dcontext.data_ptr(), D(6), nullptr, stream);
    kernels::bert_attention_backward(l.dtype, qkv.data_ptr(), lengths.data_ptr<int32_t>(), context.data_ptr(),
                                     lse.data_ptr<float>(), dcontext.data_ptr(), dqkv.data_ptr(), scratch.data_ptr(),
                                     shape, static_cast<float>(scale), l.attention, stream);
    kernels::linear_weight_gradient(gemm, l.dtype, {N, 3 * H, H, false}, dqkv.data_ptr(), x.data_ptr(), D(0), D(1),
                                    false, stream);
    kernels::linear_input_gradient(gemm, l.dtype, {N, 3 * H, H, false}, dqkv.data_ptr(), P(0), dx.data_ptr(), true,
                                   stream);
  }
  std::vector<at::Tensor> dparams;
  dparams.reserve(kParams);
  for (int k = 0; k < kParams; ++k) dparams.push_back(unpack_as(dpacked, l.offset[k], params[k]));
  return {dx, dparams};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("bert_layer", &forward);
  m.impl("bert_layer_backward", &backward);
}

}  // namespace fusekit::torch_ops
