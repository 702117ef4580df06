// fusekit::embedding_layernorm and its backward over kernels/embedding_layernorm.h: BERT's three
// lookups summed, LayerNorm and dropout. Ids are int64 tensors of one shape (tokens = numel); the
// backward writes every row of the three table gradients (zeros where no token used a row, and
// in row padding_idx of the word table unless it is negative: nn.Embedding's padding_idx).
#include <torch/library.h>

#include <tuple>

#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/embedding_layernorm.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

struct Checked {
  kernels::DType dtype;
  kernels::EmbeddingLayerNormSizes sizes;
  kernels::Dropout dropout;
};

Checked check(const at::Tensor& word_ids, const at::Tensor& position_ids, const at::Tensor& token_type_ids,
              const at::Tensor& word, const at::Tensor& position, const at::Tensor& token_type, const at::Tensor& gamma,
              double p, const at::Tensor& philox, const char* op) {
  check_cuda(word_ids, at::kLong, op, "word_ids");
  check_cuda(position_ids, at::kLong, op, "position_ids");
  check_cuda(token_type_ids, at::kLong, op, "token_type_ids");
  TORCH_CHECK_VALUE(position_ids.sizes() == word_ids.sizes() && token_type_ids.sizes() == word_ids.sizes(),
                    text("fusekit::", op, ": word_ids ", word_ids.sizes(), ", position_ids ", position_ids.sizes(),
                         " and token_type_ids ", token_type_ids.sizes(), " must have one shape (expand them)"));
  check_cuda(word, op, "word");
  check_cuda(position, op, "position");
  check_cuda(token_type, op, "token_type");
  check_cuda(gamma, op, "gamma");
  const kernels::DType dtype = dtype_of(word, op, "word");
  check_same(word, "word", {{&position, "position"}, {&token_type, "token_type"}, {&gamma, "gamma"}}, op);
  TORCH_CHECK_VALUE(word_ids.device() == word.device(), text("fusekit::", op, ": the ids are on ", word_ids.device(),
                                                             " but the tables on ", word.device()));
  TORCH_CHECK_VALUE(word.dim() == 2 && position.dim() == 2 && token_type.dim() == 2 &&
                        position.size(1) == word.size(1) && token_type.size(1) == word.size(1),
                    text("fusekit::", op, ": the tables must be [rows, H] of one H: word ", word.sizes(), ", position ",
                         position.sizes(), ", token_type ", token_type.sizes()));
  check_numel(gamma, word.size(1), op, "gamma");
  check_dropout(p, op);
  const PhiloxStream stream = philox_of(philox, word, op);
  kernels::EmbeddingLayerNormSizes sizes;
  sizes.tokens = int_size(word_ids.numel(), op, "tokens");
  sizes.hidden = int_size(word.size(1), op, "H");
  sizes.vocab = int_size(word.size(0), op, "vocabulary");
  sizes.max_positions = int_size(position.size(0), op, "positions");
  sizes.token_types = int_size(token_type.size(0), op, "token types");
  return {dtype, sizes, kernels::Dropout{static_cast<float>(p), stream.seed, stream.offset, stream.counter}};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& word_ids, const at::Tensor& position_ids,
                                                       const at::Tensor& token_type_ids, const at::Tensor& word,
                                                       const at::Tensor& position, const at::Tensor& token_type,
                                                       const at::Tensor& gamma, const at::Tensor& beta, double p,
                                                       const at::Tensor& philox, double eps, int64_t padding_idx) {
  constexpr const char* op = "embedding_layernorm";
  const Checked c = check(word_ids, position_ids, token_type_ids, word, position, token_type, gamma, p, philox, op);
  TORCH_CHECK_VALUE(padding_idx < word.size(0), text("fusekit::", op, ": padding_idx ", padding_idx,
                                                     " is outside the word table's ", word.size(0), " rows"));
  check_cuda(beta, op, "beta");
  check_same(word, "word", {{&beta, "beta"}}, op);
  check_numel(beta, word.size(1), op, "beta");
  const c10::cuda::CUDAGuard guard(word.device());
  std::vector<int64_t> shape = word_ids.sizes().vec();
  shape.push_back(word.size(1));
  at::Tensor y = at::empty(shape, word.options());
  at::Tensor mean = at::empty({c.sizes.tokens}, word.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({c.sizes.tokens}, word.options().dtype(at::kFloat));
  if (c.sizes.tokens == 0) return {y, mean, rstd};
  kernels::EmbeddingLayerNormForwardTensors t;
  t.word_ids = word_ids.data_ptr<int64_t>();
  t.position_ids = position_ids.data_ptr<int64_t>();
  t.token_type_ids = token_type_ids.data_ptr<int64_t>();
  t.word = word.data_ptr();
  t.position = position.data_ptr();
  t.token_type = token_type.data_ptr();
  t.gamma = gamma.data_ptr();
  t.beta = beta.data_ptr();
  t.y = y.data_ptr();
  t.mean = mean.data_ptr<float>();
  t.rstd = rstd.data_ptr<float>();
  kernels::embedding_layernorm_forward(c.dtype, t, c.dropout, c.sizes, static_cast<float>(eps), current_stream(word));
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& dy, const at::Tensor& word_ids, const at::Tensor& position_ids, const at::Tensor& token_type_ids,
    const at::Tensor& word, const at::Tensor& position, const at::Tensor& token_type, const at::Tensor& gamma,
    const at::Tensor& mean, const at::Tensor& rstd, double p, const at::Tensor& philox, int64_t padding_idx) {
  constexpr const char* op = "embedding_layernorm_backward";
  const Checked c = check(word_ids, position_ids, token_type_ids, word, position, token_type, gamma, p, philox, op);
  check_cuda(dy, op, "dy");
  check_same(word, "word", {{&dy, "dy"}}, op);
  check_numel(dy, static_cast<int64_t>(c.sizes.tokens) * c.sizes.hidden, op, "dy");
  check_cuda(mean, at::kFloat, op, "mean");
  check_cuda(rstd, at::kFloat, op, "rstd");
  check_numel(mean, c.sizes.tokens, op, "mean");
  check_numel(rstd, c.sizes.tokens, op, "rstd");
  TORCH_CHECK_VALUE(padding_idx < word.size(0), text("fusekit::", op, ": padding_idx ", padding_idx,
                                                     " is outside the word table's ", word.size(0), " rows"));
  const c10::cuda::CUDAGuard guard(word.device());
  at::Tensor dword = at::empty_like(word), dposition = at::empty_like(position);
  at::Tensor dtoken_type = at::empty_like(token_type), dgamma = at::empty_like(gamma), dbeta = at::empty_like(gamma);
  if (c.sizes.tokens == 0) {
    for (at::Tensor* t : {&dword, &dposition, &dtoken_type, &dgamma, &dbeta}) t->zero_();
    return {dword, dposition, dtoken_type, dgamma, dbeta};
  }
  at::Tensor scratch = workspace(kernels::embedding_layernorm_backward_workspace_bytes(c.sizes), word);
  kernels::EmbeddingLayerNormBackwardTensors t;
  t.dy = dy.data_ptr();
  t.word_ids = word_ids.data_ptr<int64_t>();
  t.position_ids = position_ids.data_ptr<int64_t>();
  t.token_type_ids = token_type_ids.data_ptr<int64_t>();
  t.word = word.data_ptr();
  t.position = position.data_ptr();
  t.token_type = token_type.data_ptr();
  t.gamma = gamma.data_ptr();
  t.mean = mean.data_ptr<float>();
  t.rstd = rstd.data_ptr<float>();
  t.dword = dword.data_ptr();
  t.dposition = dposition.data_ptr();
  t.dtoken_type = dtoken_type.data_ptr();
  t.dgamma = dgamma.data_ptr();
  t.dbeta = dbeta.data_ptr();
  kernels::embedding_layernorm_backward(c.dtype, t, c.dropout, c.sizes, scratch.data_ptr(), current_stream(word));
  if (padding_idx >= 0) dword[padding_idx].zero_();
  return {dword, dposition, dtoken_type, dgamma, dbeta};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("embedding_layernorm", &forward);
  m.impl("embedding_layernorm_backward", &backward);
}

}  // namespace fusekit::torch_ops
