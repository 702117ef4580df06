// Float64 reference of embedding + LayerNorm + dropout, forward and backward (the math and the
// treatment of out-of-range ids are in kernels/embedding_layernorm.h). The dropout multipliers come
// from reference::dropout_multipliers (kernels/reference/bias_dropout_residual_layernorm.h): the same
// Philox stream, element r * H + c.
#pragma once

#include <cstdint>
#include <vector>

namespace fusekit::reference {

struct EmbeddingIds {
  std::vector<int64_t> word, position, type;  // [tokens] each
};

struct EmbeddingTables {
  std::vector<double> word, position, type;  // [vocab, H], [max_positions, H], [token_types, H]
  int vocab, max_positions, token_types;
};

struct EmbeddingLayerNormForward {
  std::vector<double> e, y, mean, rstd;  // rows with an id out of range: e 0, y, mean and rstd NaN
};

EmbeddingLayerNormForward embedding_layernorm_forward(const EmbeddingIds& ids, const EmbeddingTables& tables,
                                                      const std::vector<double>& gamma, const std::vector<double>& beta,
                                                      const std::vector<double>& multipliers, int hidden, double eps);

struct EmbeddingLayerNormBackward {
  std::vector<double> dword, dposition, dtoken_type, dgamma, dbeta;
  std::vector<double> de;  // [tokens, H]: each token's gradient of e (0 for rows out of range)
};

// Rows with an id out of range contribute nothing.
EmbeddingLayerNormBackward embedding_layernorm_backward(const std::vector<double>& dy, const EmbeddingIds& ids,
                                                        const EmbeddingTables& tables, const std::vector<double>& gamma,
                                                        const std::vector<double>& multipliers, int hidden, double eps);

}  // namespace fusekit::reference
