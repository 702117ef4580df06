// Embedding + LayerNorm + dropout as PyTorch eager computes BERT's embedding layer: three
// at::embedding lookups added, at::layer_norm, at::dropout; autograd for the backward (the tables'
// gradients are dense, as nn.Embedding's without sparse=True). Ids are int64 tensors.
//
// `mask` (tests only): PyTorch's dropout RNG cannot be made to draw fusekit's mask, so a test passes
// the fused kernels' mask (1 kept, 0 dropped) and dropout becomes y * mask / (1 - p). Undefined:
// at::dropout draws its own.
#pragma once

#include <ATen/ATen.h>

namespace fusekit::baselines {

struct EmbeddingLayerNormInputs {
  at::Tensor word_ids, position_ids, token_type_ids;  // [tokens] int64
  at::Tensor word, position, token_type;              // [vocab, H], [max_positions, H], [token_types, H]
  at::Tensor gamma, beta;                             // [H]
};

at::Tensor embedding_layernorm_forward(const EmbeddingLayerNormInputs& in, double p, double eps,
                                       const at::Tensor& mask = {});

struct EmbeddingLayerNormGradients {
  at::Tensor y, dword, dposition, dtoken_type, dgamma, dbeta;
};

// Forward with autograd on, then backward from dy, as one eager training step runs it.
EmbeddingLayerNormGradients embedding_layernorm_forward_backward(const EmbeddingLayerNormInputs& in,
                                                                 const at::Tensor& dy, double p, double eps,
                                                                 const at::Tensor& mask = {});

}  // namespace fusekit::baselines
