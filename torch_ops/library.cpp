// The schemas of fusekit's torch.ops (namespace `fusekit`): forward and backward of each fused
// operator as separate ops. The CUDA implementations are in one file per operator (same name as in
// kernels/); autograd formulas and fake (shape-only) implementations are registered by the Python
// package (python/fusekit/ops.py), which is also what users call.
//
// Conventions shared by every op:
// - Tensors are CUDA, contiguous, of one storage type (float32, float16, bfloat16) unless stated;
//   row-wise ops take x of shape [..., C] as rows = x.numel() / C rows of C.
// - mean, rstd, lse and other saved statistics are float32.
// - A dropout takes p and `philox`: an int64 tensor (seed, offset) that the Python side draws from
//   PyTorch's generator, on the CPU, or on the data's device while torch.compile traces (then the
//   kernels read the offset there, tensor_checks.h's philox_of); the backward takes the same tensor
//   and regenerates the mask.
#include <torch/library.h>

TORCH_LIBRARY(fusekit, m) {
  m.def("layernorm(Tensor x, Tensor gamma, Tensor beta, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "layernorm_backward(Tensor dy, Tensor x, Tensor gamma, Tensor mean, Tensor rstd) -> (Tensor dx, Tensor dgamma, "
      "Tensor dbeta)");
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate) -> Tensor");
  m.def("bias_gelu_backward(Tensor dy, Tensor x, Tensor bias, str approximate) -> (Tensor dx, Tensor dbias)");
  m.def(
      "bias_dropout_residual_layernorm(Tensor x, Tensor bias, Tensor residual, Tensor gamma, Tensor beta, float p, "
      "Tensor philox, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "bias_dropout_residual_layernorm_backward(Tensor dy, Tensor x, Tensor bias, Tensor residual, Tensor gamma, "
      "Tensor mean, Tensor rstd, float p, Tensor philox) -> (Tensor dx, Tensor dresidual, Tensor dbias, Tensor dgamma, "
      "Tensor dbeta)");
  m.def(
      "embedding_layernorm(Tensor word_ids, Tensor position_ids, Tensor token_type_ids, Tensor word, Tensor position, "
      "Tensor token_type, Tensor gamma, Tensor beta, float p, Tensor philox, float eps, int padding_idx) -> (Tensor y, "
      "Tensor mean, Tensor rstd)");
  m.def(
      "embedding_layernorm_backward(Tensor dy, Tensor word_ids, Tensor position_ids, Tensor token_type_ids, "
      "Tensor word, Tensor position, Tensor token_type, Tensor gamma, Tensor mean, Tensor rstd, float p, "
      "Tensor philox, int padding_idx) -> (Tensor dword, Tensor dposition, Tensor dtoken_type, Tensor dgamma, Tensor "
      "dbeta)");
  m.def("bert_attention(Tensor qkv, Tensor lengths, float scale, float p, Tensor philox) -> (Tensor out, Tensor lse)");
  m.def(
      "bert_attention_backward(Tensor dout, Tensor qkv, Tensor lengths, Tensor out, Tensor lse, float scale, "
      "float p, Tensor philox) -> Tensor dqkv");
  m.def(
      "cross_entropy(Tensor logits, Tensor labels, int ignore_index, float label_smoothing) -> (Tensor loss, "
      "Tensor lse, Tensor valid)");
  m.def(
      "cross_entropy_backward(Tensor dloss, Tensor logits, Tensor labels, Tensor lse, Tensor valid, int ignore_index, "
      "float label_smoothing) -> Tensor dlogits");
  m.def(
      "window_partition(Tensor x, Tensor gamma, Tensor beta, int window, int shift, float eps) -> (Tensor windows, "
      "Tensor mean, Tensor rstd)");
  m.def(
      "window_partition_backward(Tensor dwindows, Tensor x, Tensor gamma, Tensor mean, Tensor rstd, int window, "
      "int shift) -> (Tensor dx, Tensor dgamma, Tensor dbeta)");
  m.def("window_merge(Tensor windows, Tensor shortcut, int window, int shift) -> Tensor y");
  m.def("window_merge_backward(Tensor dy, int window, int shift) -> Tensor dwindows");
  m.def("patch_merging(Tensor x, Tensor gamma, Tensor beta, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "patch_merging_backward(Tensor dy, Tensor x, Tensor gamma, Tensor mean, Tensor rstd) -> (Tensor dx, "
      "Tensor dgamma, Tensor dbeta)");
  m.def(
      "window_attention(Tensor qkv, Tensor table, Tensor index, Tensor? mask, float scale) -> (Tensor out, "
      "Tensor bias, Tensor lse)");
  m.def(
      "window_attention_backward(Tensor dout, Tensor qkv, Tensor table, Tensor index, Tensor? mask, Tensor out, "
      "Tensor bias, Tensor lse, float scale) -> (Tensor dqkv, Tensor dtable)");
  m.def("softmax(Tensor x, float scale, str mask, Tensor? lengths) -> Tensor y");
  m.def("linear(Tensor x, Tensor weight, Tensor bias, str epilogue) -> (Tensor y, Tensor pre)");
  m.def(
      "linear_backward(Tensor dy, Tensor x, Tensor weight, Tensor pre, str epilogue) -> (Tensor dx, Tensor dweight, "
      "Tensor dbias)");
  m.def(
      "adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, float lr, "
      "float beta1, float beta2, float eps, float weight_decay, int step) -> ()");
  m.def("softmax_backward(Tensor y, Tensor dy, float scale) -> Tensor dx");
  // A whole BERT encoder layer (torch_ops/bert_layer.cpp): params are its 16 tensors, saved the 13
  // tensors its backward takes.
  m.def(
      "bert_layer(Tensor x, Tensor lengths, Tensor[] params, int heads, float scale, float p_attention, "
      "float p_attention_output, float p_output, Tensor philox, float eps, str approximate) -> (Tensor y, "
      "Tensor[] saved)");
  m.def(
      "bert_layer_backward(Tensor dy, Tensor x, Tensor lengths, Tensor[] params, Tensor[] saved, int heads, "
      "float scale, float p_attention, float p_attention_output, float p_output, Tensor philox, str approximate) "
      "-> (Tensor dx, Tensor[] dparams)");
  // A whole Swin Transformer block (torch_ops/swin_block.cpp): params are its 13 tensors, dtype the
  // compute dtype, saved the 15 tensors its backward takes.
  m.def(
      "swin_block(Tensor x, Tensor[] params, Tensor index, Tensor? mask, Tensor? drop1, Tensor? drop2, "
      "ScalarType dtype, int window, int shift, int heads, float scale, float eps1, float eps2, str approximate) -> "
      "(Tensor y, Tensor[] saved)");
  m.def(
      "swin_block_backward(Tensor dy, Tensor x, Tensor[] params, Tensor index, Tensor? mask, Tensor? drop1, "
      "Tensor? drop2, Tensor[] saved, int window, int shift, int heads, float scale, str approximate) -> (Tensor dx, "
      "Tensor[] dparams)");
}
