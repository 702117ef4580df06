#include "kernels/reference/window_attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace fusekit::reference {
namespace {

// Offsets into the packed layouts.
struct Layout {
  WindowAttentionSizes s;
  // qkv[b, i, part, h, c]
  size_t qkv(int b, int i, int part, int h, int c) const {
    return ((((static_cast<size_t>(b) * s.tokens + i) * 3 + part) * s.heads + h) * s.head_dim) + c;
  }
  // out[b, i, h * head_dim + c]
  size_t out(int b, int i, int h, int c) const {
    return (static_cast<size_t>(b) * s.tokens + i) * s.heads * s.head_dim + static_cast<size_t>(h) * s.head_dim + c;
  }
};

// P of window b, head h: [tokens, tokens] row-major; the row's log-sum-exp into lse if given.
std::vector<double> probabilities(const std::vector<double>& qkv, const std::vector<double>& table,
                                  const std::vector<int>& index, const std::vector<double>& mask, const Layout& l,
                                  int b, int h, double scale, double* lse) {
  const int n = l.s.tokens;
  std::vector<double> p(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    double high = -INFINITY;
    for (int j = 0; j < n; ++j) {
      double z = 0;
      for (int c = 0; c < l.s.head_dim; ++c) z += qkv[l.qkv(b, i, 0, h, c)] * qkv[l.qkv(b, j, 1, h, c)];
      z = scale * z + table[static_cast<size_t>(index[static_cast<size_t>(i) * n + j]) * l.s.heads + h];
      if (l.s.mask_windows > 0) z += mask[(static_cast<size_t>(b % l.s.mask_windows) * n + i) * n + j];
      p[static_cast<size_t>(i) * n + j] = z;
      high = std::max(high, z);
    }
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += std::exp(p[static_cast<size_t>(i) * n + j] - high);
    for (int j = 0; j < n; ++j)
      p[static_cast<size_t>(i) * n + j] = std::exp(p[static_cast<size_t>(i) * n + j] - high) / sum;
    if (lse) lse[i] = high + std::log(sum);
  }
  return p;
}

}  // namespace

WindowAttentionOutputs window_attention_forward(const std::vector<double>& qkv, const std::vector<double>& table,
                                                const std::vector<int>& index, const std::vector<double>& mask,
                                                const WindowAttentionSizes& s, double scale) {
  const Layout l{s};
  const int n = s.tokens;
  WindowAttentionOutputs o;
  o.out.assign(static_cast<size_t>(s.windows) * n * s.heads * s.head_dim, 0.0);
  o.lse.assign(static_cast<size_t>(s.windows) * s.heads * n, 0.0);
  for (int b = 0; b < s.windows; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      const std::vector<double> p =
          probabilities(qkv, table, index, mask, l, b, h, scale, &o.lse[(static_cast<size_t>(b) * s.heads + h) * n]);
      for (int i = 0; i < n; ++i) {
        for (int c = 0; c < s.head_dim; ++c) {
          double sum = 0;
          for (int j = 0; j < n; ++j) sum += p[static_cast<size_t>(i) * n + j] * qkv[l.qkv(b, j, 2, h, c)];
          o.out[l.out(b, i, h, c)] = sum;
        }
      }
    }
  }
  return o;
}

WindowAttentionGradients window_attention_backward(const std::vector<double>& qkv, const std::vector<double>& table,
                                                   const std::vector<int>& index, const std::vector<double>& mask,
                                                   const std::vector<double>& dout, const WindowAttentionSizes& s,
                                                   double scale) {
  const Layout l{s};
  const int n = s.tokens, d = s.head_dim;
  WindowAttentionGradients g;
  g.dqkv.assign(qkv.size(), 0.0);
  g.dtable.assign(table.size(), 0.0);
  std::vector<double> dp(static_cast<size_t>(n) * n);
  for (int b = 0; b < s.windows; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      const std::vector<double> p = probabilities(qkv, table, index, mask, l, b, h, scale, nullptr);
      // dV = P^T dO, dP = dO V^T
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          double sum = 0;
          for (int c = 0; c < d; ++c) {
            g.dqkv[l.qkv(b, j, 2, h, c)] += p[static_cast<size_t>(i) * n + j] * dout[l.out(b, i, h, c)];
            sum += dout[l.out(b, i, h, c)] * qkv[l.qkv(b, j, 2, h, c)];
          }
          dp[static_cast<size_t>(i) * n + j] = sum;
        }
      }
      // dS = P (dP - sum_j P dP) row by row (the softmax's Jacobian); dQ, dK through S = scale Q K^T.
      for (int i = 0; i < n; ++i) {
        double dot = 0;
        for (int j = 0; j < n; ++j) dot += p[static_cast<size_t>(i) * n + j] * dp[static_cast<size_t>(i) * n + j];
        for (int j = 0; j < n; ++j) {
          const double ds = p[static_cast<size_t>(i) * n + j] * (dp[static_cast<size_t>(i) * n + j] - dot);
          g.dtable[static_cast<size_t>(index[static_cast<size_t>(i) * n + j]) * s.heads + h] += ds;
          for (int c = 0; c < d; ++c) {
            g.dqkv[l.qkv(b, i, 0, h, c)] += scale * ds * qkv[l.qkv(b, j, 1, h, c)];
            g.dqkv[l.qkv(b, j, 1, h, c)] += scale * ds * qkv[l.qkv(b, i, 0, h, c)];
          }
        }
      }
    }
  }
  return g;
}

}  // namespace fusekit::reference
