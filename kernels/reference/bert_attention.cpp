#include "kernels/reference/bert_attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/detail/philox.cuh"

namespace fusekit::reference {
namespace {

// Offsets into the packed layouts.
struct Layout {
  BertAttentionSizes s;
  // qkv[b, i, part, h, c]
  size_t qkv(int b, int i, int part, int h, int c) const {
    return ((((static_cast<size_t>(b) * s.seq + i) * 3 + part) * s.heads + h) * s.head_dim) + c;
  }
  // out[b, i, h * head_dim + c]
  size_t out(int b, int i, int h, int c) const {
    return (static_cast<size_t>(b) * s.seq + i) * s.heads * s.head_dim + static_cast<size_t>(h) * s.head_dim + c;
  }
  // M[b, h, i, j]
  size_t pair(int b, int h, int i, int j) const {
    return ((static_cast<size_t>(b) * s.heads + h) * s.seq + i) * s.seq + j;
  }
};

int valid_of(const std::vector<int>& valid_lengths, const BertAttentionSizes& s, int b) {
  return std::min(std::max(valid_lengths[b], 0), s.seq);
}

// P of sequence b, head h: [seq, seq] row-major, 0 for keys past the valid length (and every entry
// when there is none); the row's log-sum-exp into lse if given (0 without valid keys).
std::vector<double> probabilities(const std::vector<double>& qkv, int valid, const Layout& l, int b, int h,
                                  double scale, double* lse) {
  const int n = l.s.seq;
  std::vector<double> p(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    if (lse) lse[i] = 0;
    if (valid == 0) continue;
    double high = -INFINITY;
    double* row = &p[static_cast<size_t>(i) * n];
    for (int j = 0; j < valid; ++j) {
      double z = 0;
      for (int c = 0; c < l.s.head_dim; ++c) z += qkv[l.qkv(b, i, 0, h, c)] * qkv[l.qkv(b, j, 1, h, c)];
      row[j] = scale * z;
      high = std::max(high, row[j]);
    }
    double sum = 0;
    for (int j = 0; j < valid; ++j) sum += std::exp(row[j] - high);
    for (int j = 0; j < valid; ++j) row[j] = std::exp(row[j] - high) / sum;
    if (lse) lse[i] = high + std::log(sum);
  }
  return p;
}

}  // namespace

std::vector<double> bert_attention_dropout_multipliers(const BertAttentionSizes& s, float p, uint64_t seed,
                                                       uint64_t offset) {
  const size_t count = static_cast<size_t>(s.batch) * s.heads * s.seq * s.seq;
  std::vector<double> m(count, 1.0);
  if (p <= 0.f) return m;
  const uint32_t threshold = kernels::dropout_threshold(p);
  const double kept = 1.0 / (1.0 - static_cast<double>(p));
  for (size_t e = 0; e < count; ++e) m[e] = kernels::dropout_kept(seed, offset, e, threshold) ? kept : 0.0;
  return m;
}

BertAttentionOutputs bert_attention_forward(const std::vector<double>& qkv, const std::vector<int>& valid_lengths,
                                            const std::vector<double>& multipliers, const BertAttentionSizes& s,
                                            double scale) {
  const Layout l{s};
  const int n = s.seq;
  BertAttentionOutputs o;
  o.out.assign(static_cast<size_t>(s.batch) * n * s.heads * s.head_dim, 0.0);
  o.lse.assign(static_cast<size_t>(s.batch) * s.heads * n, 0.0);
  for (int b = 0; b < s.batch; ++b) {
    const int valid = valid_of(valid_lengths, s, b);
    for (int h = 0; h < s.heads; ++h) {
      const std::vector<double> p =
          probabilities(qkv, valid, l, b, h, scale, &o.lse[(static_cast<size_t>(b) * s.heads + h) * n]);
      for (int i = 0; i < n; ++i) {
        for (int c = 0; c < s.head_dim; ++c) {
          double sum = 0;
          for (int j = 0; j < valid; ++j) {
            const double m = multipliers.empty() ? 1.0 : multipliers[l.pair(b, h, i, j)];
            sum += p[static_cast<size_t>(i) * n + j] * m * qkv[l.qkv(b, j, 2, h, c)];
          }
          o.out[l.out(b, i, h, c)] = sum;
        }
      }
    }
  }
  return o;
}

std::vector<double> bert_attention_backward(const std::vector<double>& qkv, const std::vector<int>& valid_lengths,
                                            const std::vector<double>& multipliers, const std::vector<double>& dout,
                                            const BertAttentionSizes& s, double scale, const std::vector<double>& out) {
  const Layout l{s};
  const int n = s.seq, d = s.head_dim;
  std::vector<double> dqkv(qkv.size(), 0.0);
  std::vector<double> dp(static_cast<size_t>(n) * n);
  for (int b = 0; b < s.batch; ++b) {
    const int valid = valid_of(valid_lengths, s, b);
    for (int h = 0; h < s.heads; ++h) {
      const std::vector<double> p = probabilities(qkv, valid, l, b, h, scale, nullptr);
      // dV = (P M)^T dO; dP = (dO V^T) M
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < valid; ++j) {
          const double m = multipliers.empty() ? 1.0 : multipliers[l.pair(b, h, i, j)];
          double sum = 0;
          for (int c = 0; c < d; ++c) {
            dqkv[l.qkv(b, j, 2, h, c)] += p[static_cast<size_t>(i) * n + j] * m * dout[l.out(b, i, h, c)];
            sum += dout[l.out(b, i, h, c)] * qkv[l.qkv(b, j, 2, h, c)];
          }
          dp[static_cast<size_t>(i) * n + j] = sum * m;
        }
      }
      // dS = P (dP - sum_j P dP) row by row (the softmax's Jacobian); dQ, dK through S = scale Q K^T.
      for (int i = 0; i < n; ++i) {
        double dot = 0;
        if (out.empty()) {
          for (int j = 0; j < valid; ++j) dot += p[static_cast<size_t>(i) * n + j] * dp[static_cast<size_t>(i) * n + j];
        } else {
          for (int c = 0; c < d; ++c) dot += dout[l.out(b, i, h, c)] * out[l.out(b, i, h, c)];
        }
        for (int j = 0; j < valid; ++j) {
          const double ds = p[static_cast<size_t>(i) * n + j] * (dp[static_cast<size_t>(i) * n + j] - dot);
          for (int c = 0; c < d; ++c) {
            dqkv[l.qkv(b, i, 0, h, c)] += scale * ds * qkv[l.qkv(b, j, 1, h, c)];
            dqkv[l.qkv(b, j, 1, h, c)] += scale * ds * qkv[l.qkv(b, i, 0, h, c)];
          }
        }
      }
    }
  }
  return dqkv;
}

}  // namespace fusekit::reference
