// The float64 reference of BERT attention, with no GPU: the forward on inputs whose answer is known
// (uniform attention averages the valid values; the log-sum-exp), a sequence with no valid key,
// every gradient against central finite differences of the forward (without dropout and with a
// Philox mask) and with D taken from O (FlashAttention's identity, as the fused backward does), and
// the 8-element kept flags the kernels draw (dropout_kept_bits8, with the round keys) at every
// alignment against the element-by-element stream.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/detail/philox.cuh"
#include "kernels/reference/bert_attention.h"
#include "tests/cpu/reference_test_support.h"

namespace fusekit {
namespace {

using test::dot;
using test::random_vector;

size_t qkv_at(const reference::BertAttentionSizes& s, int b, int i, int part, int h, int c) {
  return ((((static_cast<size_t>(b) * s.seq + i) * 3 + part) * s.heads + h) * s.head_dim) + c;
}

TEST(BertAttentionReference, UniformAttentionAveragesValidValues) {
  const reference::BertAttentionSizes s{3, 2, 5, 3};
  const std::vector<int> valid{5, 2, 0};
  std::mt19937_64 rng(7);
  std::vector<double> qkv = random_vector(static_cast<size_t>(s.batch) * s.seq * 3 * s.heads * s.head_dim, rng);
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.seq; ++i)
      for (int h = 0; h < s.heads; ++h)
        for (int c = 0; c < s.head_dim; ++c) qkv[qkv_at(s, b, i, 1, h, c)] = 0;  // K = 0: equal scores
  const auto o = reference::bert_attention_forward(qkv, valid, {}, s, 0.3);
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      for (int i = 0; i < s.seq; ++i) {
        const double lse = o.lse[(b * s.heads + h) * s.seq + i];
        EXPECT_NEAR(lse, valid[b] > 0 ? std::log(static_cast<double>(valid[b])) : 0.0, 1e-12);
        for (int c = 0; c < s.head_dim; ++c) {
          double mean = 0;
          for (int j = 0; j < valid[b]; ++j) mean += qkv[qkv_at(s, b, j, 2, h, c)];
          if (valid[b] > 0) mean /= valid[b];
          EXPECT_NEAR(o.out[(b * s.seq + i) * s.heads * s.head_dim + h * s.head_dim + c], mean, 1e-12);
        }
      }
    }
  }
}

void check_gradients(float p) {
  // Valid lengths: all keys, some keys (padding), one key, none.
  const reference::BertAttentionSizes s{4, 2, 5, 3};
  const std::vector<int> valid{5, 3, 1, 0};
  const double scale = 0.6;
  std::mt19937_64 rng(11);
  std::vector<double> qkv = random_vector(static_cast<size_t>(s.batch) * s.seq * 3 * s.heads * s.head_dim, rng);
  const std::vector<double> g = random_vector(static_cast<size_t>(s.batch) * s.seq * s.heads * s.head_dim, rng);
  const std::vector<double> m = reference::bert_attention_dropout_multipliers(s, p, 1234, 56);
  auto loss = [&] { return dot(reference::bert_attention_forward(qkv, valid, m, s, scale).out, g); };
  const std::vector<double> dqkv = reference::bert_attention_backward(qkv, valid, m, g, s, scale);
  ASSERT_EQ(dqkv.size(), qkv.size());
  const double h = 1e-6;
  for (size_t e = 0; e < qkv.size(); ++e) {
    const double saved = qkv[e];
    qkv[e] = saved + h;
    const double up = loss();
    qkv[e] = saved - h;
    const double down = loss();
    qkv[e] = saved;
    EXPECT_NEAR(dqkv[e], (up - down) / (2 * h), 1e-6 * (1 + std::abs(dqkv[e]))) << "dqkv[" << e << "]";
  }
  // FlashAttention's identity with dropout: D_i = dO_i . O_i, with O = (P * M) V, is sum_j P dP with
  // dP = (dO V^T) * M, so D taken from the exact O (as the fused backward takes it from the stored one)
  // gives the same gradients.
  const auto o = reference::bert_attention_forward(qkv, valid, m, s, scale);
  const std::vector<double> from_out = reference::bert_attention_backward(qkv, valid, m, g, s, scale, o.out);
  for (size_t e = 0; e < qkv.size(); ++e) EXPECT_NEAR(from_out[e], dqkv[e], 1e-12) << "dqkv[" << e << "], D from O";
  // Masked keys get exactly zero dK and dV; a sequence without valid keys, zero gradients and output.
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.seq; ++i) {
      for (int hd = 0; hd < s.heads; ++hd) {
        for (int c = 0; c < s.head_dim; ++c) {
          if (i >= valid[b]) {
            EXPECT_EQ(dqkv[qkv_at(s, b, i, 1, hd, c)], 0.0);
            EXPECT_EQ(dqkv[qkv_at(s, b, i, 2, hd, c)], 0.0);
          }
          if (valid[b] == 0) {
            EXPECT_EQ(dqkv[qkv_at(s, b, i, 0, hd, c)], 0.0);
            EXPECT_EQ(o.out[(b * s.seq + i) * s.heads * s.head_dim + hd * s.head_dim + c], 0.0);
          }
        }
      }
    }
  }
}

TEST(BertAttentionReference, GradientsMatchFiniteDifferencesWithoutDropout) { check_gradients(0.f); }

TEST(BertAttentionReference, GradientsMatchFiniteDifferencesWithPhiloxMask) { check_gradients(0.3f); }

TEST(BertAttentionReference, DropoutChangesTheOutputAndKeepsAboutOneMinusP) {
  const reference::BertAttentionSizes s{2, 3, 40, 4};
  const std::vector<double> m = reference::bert_attention_dropout_multipliers(s, 0.25f, 9, 3);
  size_t kept = 0;
  for (double v : m) {
    ASSERT_TRUE(v == 0.0 || std::abs(v - 1.0 / 0.75) < 1e-12);
    kept += v != 0.0;
  }
  const double fraction = static_cast<double>(kept) / m.size();  // 9600 draws: sd 0.0044
  EXPECT_NEAR(fraction, 0.75, 0.025);
  for (double v : reference::bert_attention_dropout_multipliers(s, 0.f, 9, 3)) ASSERT_EQ(v, 1.0);
}

TEST(BertAttentionReference, KeptBitsOfEightElementsWithRoundKeysMatchTheStreamAtEveryAlignment) {
  const uint32_t threshold = kernels::dropout_threshold(0.5f);
  for (uint64_t seed : {uint64_t{77}, uint64_t{0xFFFFFFFF00000001ull}}) {
    const kernels::PhiloxKeys keys = kernels::philox_keys(seed);
    for (uint64_t first = 0; first < 64; ++first) {
      // Also across the carry of the group counter's low word (group 2^32 - 1 to 2^32: element 2^35).
      for (uint64_t base : {uint64_t{0}, (uint64_t{1} << 35) - 32}) {
        const uint32_t bits = kernels::dropout_kept_bits8(keys, 5, base + first, threshold);
        for (int k = 0; k < 8; ++k) {
          EXPECT_EQ((bits >> k) & 1u, kernels::dropout_kept(seed, 5, base + first + k, threshold) ? 1u : 0u)
              << "seed " << seed << " first " << base + first << " k " << k;
        }
        EXPECT_EQ(bits >> 8, 0u);
      }
    }
  }
}

TEST(BertAttentionReference, RoundKeysGiveThePhiloxWords) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{0x243F6A8885A308D3ull}, ~uint64_t{0}}) {
    const kernels::PhiloxKeys keys = kernels::philox_keys(seed);
    for (uint32_t c : {0u, 1u, 0xDEADBEEFu}) {
      const kernels::PhiloxWords counter{{c, ~c, c * 3u, 7u}};
      const kernels::PhiloxWords a = kernels::philox4x32_10(counter, keys);
      const kernels::PhiloxWords b =
          kernels::philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
      for (int w = 0; w < 4; ++w) EXPECT_EQ(a.w[w], b.w[w]) << "seed " << seed << " counter " << c << " word " << w;
    }
  }
}

}  // namespace
}  // namespace fusekit
