#include "kernels/reference/embedding_layernorm.h"

#include <cmath>
#include <cstddef>
#include <limits>

namespace fusekit::reference {
namespace {

bool in_range(const EmbeddingIds& ids, const EmbeddingTables& tables, size_t r) {
  return ids.word[r] >= 0 && ids.word[r] < tables.vocab && ids.position[r] >= 0 &&
         ids.position[r] < tables.max_positions && ids.type[r] >= 0 && ids.type[r] < tables.token_types;
}

}  // namespace

EmbeddingLayerNormForward embedding_layernorm_forward(const EmbeddingIds& ids, const EmbeddingTables& tables,
                                                      const std::vector<double>& gamma, const std::vector<double>& beta,
                                                      const std::vector<double>& multipliers, int hidden, double eps) {
  const size_t tokens = ids.word.size(), H = hidden;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EmbeddingLayerNormForward out{std::vector<double>(tokens * H, 0.0), std::vector<double>(tokens * H, nan),
                                std::vector<double>(tokens, nan), std::vector<double>(tokens, nan)};
  for (size_t r = 0; r < tokens; ++r) {
    if (!in_range(ids, tables, r)) continue;
    double* e = &out.e[r * H];
    for (size_t c = 0; c < H; ++c) {
      e[c] = tables.word[ids.word[r] * H + c] + tables.position[ids.position[r] * H + c] +
             tables.type[ids.type[r] * H + c];
    }
    double mean = 0;
    for (size_t c = 0; c < H; ++c) mean += e[c];
    mean /= H;
    double var = 0;
    for (size_t c = 0; c < H; ++c) var += (e[c] - mean) * (e[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / H + eps);
    for (size_t c = 0; c < H; ++c)
      out.y[r * H + c] = ((e[c] - mean) * rstd * gamma[c] + beta[c]) * multipliers[r * H + c];
    out.mean[r] = mean;
    out.rstd[r] = rstd;
  }
  return out;
}

EmbeddingLayerNormBackward embedding_layernorm_backward(const std::vector<double>& dy, const EmbeddingIds& ids,
                                                        const EmbeddingTables& tables, const std::vector<double>& gamma,
                                                        const std::vector<double>& multipliers, int hidden,
                                                        double eps) {
  const size_t tokens = ids.word.size(), H = hidden;
  const EmbeddingLayerNormForward f = embedding_layernorm_forward(ids, tables, gamma, std::vector<double>(H, 0.0),
                                                                  std::vector<double>(tokens * H, 1.0), hidden, eps);
  EmbeddingLayerNormBackward out{std::vector<double>(tables.word.size(), 0.0),
                                 std::vector<double>(tables.position.size(), 0.0),
                                 std::vector<double>(tables.type.size(), 0.0),
                                 std::vector<double>(H, 0.0),
                                 std::vector<double>(H, 0.0),
                                 std::vector<double>(tokens * H, 0.0)};
  std::vector<double> d(H), xhat(H), g(H);
  for (size_t r = 0; r < tokens; ++r) {
    if (!in_range(ids, tables, r)) continue;
    double mean_g = 0, mean_gx = 0;
    for (size_t c = 0; c < H; ++c) {
      d[c] = dy[r * H + c] * multipliers[r * H + c];  // through the dropout
      xhat[c] = (f.e[r * H + c] - f.mean[r]) * f.rstd[r];
      g[c] = d[c] * gamma[c];
      mean_g += g[c];
      mean_gx += g[c] * xhat[c];
      out.dgamma[c] += d[c] * xhat[c];
      out.dbeta[c] += d[c];
    }
    mean_g /= H;
    mean_gx /= H;
    for (size_t c = 0; c < H; ++c) {
      const double de = f.rstd[r] * (g[c] - mean_g - xhat[c] * mean_gx);
      out.de[r * H + c] = de;
      out.dword[ids.word[r] * H + c] += de;
      out.dposition[ids.position[r] * H + c] += de;
      out.dtoken_type[ids.type[r] * H + c] += de;
    }
  }
  return out;
}

}  // namespace fusekit::reference
