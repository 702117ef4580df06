#include "baselines/embedding_layernorm.h"

#include <torch/torch.h>

namespace fusekit::baselines {
namespace {

at::Tensor compose(const EmbeddingLayerNormInputs& in, double p, double eps, const at::Tensor& mask) {
  const at::Tensor e = at::embedding(in.word, in.word_ids) + at::embedding(in.position, in.position_ids) +
                       at::embedding(in.token_type, in.token_type_ids);
  const at::Tensor normalized = at::layer_norm(e, {in.word.size(-1)}, in.gamma, in.beta, eps);
  return mask.defined() ? normalized * mask * (1.0 / (1.0 - p)) : at::dropout(normalized, p, true);
}

}  // namespace

at::Tensor embedding_layernorm_forward(const EmbeddingLayerNormInputs& in, double p, double eps,
                                       const at::Tensor& mask) {
  torch::NoGradGuard no_grad;
  return compose(in, p, eps, mask);
}

EmbeddingLayerNormGradients embedding_layernorm_forward_backward(const EmbeddingLayerNormInputs& in,
                                                                 const at::Tensor& dy, double p, double eps,
                                                                 const at::Tensor& mask) {
  EmbeddingLayerNormInputs v = in;
  for (at::Tensor* t : {&v.word, &v.position, &v.token_type, &v.gamma, &v.beta}) *t = t->detach().requires_grad_(true);
  const at::Tensor y = compose(v, p, eps, mask);
  y.backward(dy);
  return {y.detach(), v.word.grad(), v.position.grad(), v.token_type.grad(), v.gamma.grad(), v.beta.grad()};
}

}  // namespace fusekit::baselines
