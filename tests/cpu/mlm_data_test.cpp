// The synthetic MLM batches: SplitMix64's known outputs, determinism, the layout of each sequence,
// masking statistics over many batches, the bound on masked rows, and the safetensors copy.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "models/mlm_data.h"
#include "models/safetensors.h"

namespace fusekit::models {
namespace {

TEST(MlmData, SplitMix64KnownOutputs) {
  // SplitMix64 from state 0, as its reference implementation (Vigna) prints it.
  SplitMix64 random(0);
  EXPECT_EQ(random.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(random.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(random.next(), 0x06C45D188009454Full);
}

TEST(MlmData, Deterministic) {
  MlmDataOptions o;
  o.batch = 4;
  o.sequence = 64;
  o.seed = 1234;
  const MlmBatch a = make_mlm_batch(o, 7), b = make_mlm_batch(o, 7);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.token_type_ids, b.token_type_ids);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.lengths, b.lengths);
  EXPECT_NE(make_mlm_batch(o, 8).input_ids, a.input_ids);
  o.seed = 1235;
  EXPECT_NE(make_mlm_batch(o, 7).input_ids, a.input_ids);
}

// With echo, the second segment's words (before masking: the labels where masked) repeat the first
// segment's cyclically. (Echo draws fewer numbers, so only the first sequence's length is shared.)
TEST(MlmData, EchoRepeatsTheFirstSegment) {
  MlmDataOptions o;
  o.batch = 16;
  o.sequence = 48;
  o.seed = 77;
  const MlmBatch plain = make_mlm_batch(o, 3);
  o.echo = true;
  const MlmBatch echoed = make_mlm_batch(o, 3);
  EXPECT_EQ(plain.lengths[0], echoed.lengths[0]);
  int checked = 0;
  for (int b = 0; b < o.batch; ++b) {
    const int L = echoed.lengths[b];
    if (L < 5) continue;
    const int64_t* ids = &echoed.input_ids[b * o.sequence];
    const int64_t* labels = &echoed.labels[b * o.sequence];
    const auto word = [&](int s) { return labels[s] != kIgnoreLabel ? labels[s] : ids[s]; };
    int a = 0;
    while (ids[a + 1] != kSepToken) ++a;
    ASSERT_GE(a, 1);
    for (int s = a + 2; s < L - 1; ++s, ++checked) ASSERT_EQ(word(s), word(1 + (s - a - 2) % a)) << b << " " << s;
  }
  EXPECT_GT(checked, 100);
  EXPECT_NE(plain.input_ids, echoed.input_ids);
}

TEST(MlmData, SequencesAreWellFormed) {
  MlmDataOptions o;
  o.batch = 16;
  o.sequence = 40;
  o.min_length = 3;
  o.seed = 5;
  int pairs = 0, shortest = o.sequence;
  for (uint64_t k = 0; k < 50; ++k) {
    const MlmBatch batch = make_mlm_batch(o, k);
    ASSERT_EQ(batch.input_ids.size(), 16u * 40);
    EXPECT_FALSE(batch.masked_positions.empty());
    size_t masked = 0;
    for (int b = 0; b < o.batch; ++b) {
      const int L = batch.lengths[b];
      ASSERT_GE(L, 3);
      ASSERT_LE(L, o.sequence);
      shortest = std::min(shortest, L);
      const int64_t* ids = &batch.input_ids[b * o.sequence];
      const int64_t* types = &batch.token_type_ids[b * o.sequence];
      const int64_t* labels = &batch.labels[b * o.sequence];
      EXPECT_EQ(ids[0], kClsToken);
      EXPECT_EQ(ids[L - 1], kSepToken);
      int separators = 0, in_sequence = 0;
      for (int s = 0; s < o.sequence; ++s) {
        if (s >= L) {  // padding
          EXPECT_EQ(ids[s], kPadToken);
          EXPECT_EQ(types[s], 0);
          EXPECT_EQ(labels[s], kIgnoreLabel);
          continue;
        }
        const bool special = ids[s] == kClsToken || ids[s] == kSepToken;
        if (ids[s] == kSepToken) ++separators;
        // Token type 1 exactly after the first [SEP] of a pair.
        EXPECT_EQ(types[s], separators == 2 || (separators == 1 && ids[s] != kSepToken) ? 1 : 0) << s;
        if (special) {
          EXPECT_EQ(labels[s], kIgnoreLabel);
          continue;
        }
        if (labels[s] == kIgnoreLabel) {
          EXPECT_GE(ids[s], o.first_word);  // an unmasked word
          EXPECT_LT(ids[s], o.vocab);
        } else {
          ++in_sequence;
          EXPECT_GE(labels[s], o.first_word);
          EXPECT_LT(labels[s], o.vocab);
          EXPECT_TRUE(ids[s] == kMaskToken || (ids[s] >= o.first_word && ids[s] < o.vocab));
        }
      }
      EXPECT_EQ(separators, L >= 5 ? 2 : 1);
      pairs += separators == 2;
      EXPECT_GE(in_sequence, 1);
      EXPECT_LE(in_sequence, max_masked_per_sequence(o.sequence));
      masked += in_sequence;
    }
    ASSERT_EQ(batch.masked_positions.size(), masked);
    for (size_t i = 0; i < masked; ++i) {
      EXPECT_EQ(batch.labels[batch.masked_positions[i]], batch.masked_labels[i]);
      if (i > 0) {
        EXPECT_LT(batch.masked_positions[i - 1], batch.masked_positions[i]);
      }
    }
  }
  EXPECT_GT(pairs, 0);
  EXPECT_LT(shortest, 5);  // both kinds of sequence were drawn
}

TEST(MlmData, MaskingStatistics) {
  // 400 batches of 8 x 128: about 20,000 masked words. The masked fraction of the words is 15% up to
  // the rounding of each sequence's count (averaging out to well under 1%); the 80/10/10 split's
  // standard deviations are below 0.3%, so 1.5% is five of them.
  MlmDataOptions o;
  o.batch = 8;
  o.sequence = 128;
  o.seed = 42;
  size_t words = 0, masked = 0, mask_token = 0, kept = 0, length_sum = 0;
  for (uint64_t k = 0; k < 400; ++k) {
    const MlmBatch batch = make_mlm_batch(o, k);
    for (size_t t = 0; t < batch.input_ids.size(); ++t) {
      const int64_t id = batch.input_ids[t];
      const bool word = batch.labels[t] != kIgnoreLabel || id >= o.first_word;
      words += word;
      if (batch.labels[t] == kIgnoreLabel) continue;
      ++masked;
      mask_token += id == kMaskToken;
      kept += id == batch.labels[t];
    }
    for (int32_t L : batch.lengths) length_sum += L;
  }
  const double fraction = static_cast<double>(masked) / words;
  EXPECT_NEAR(fraction, 0.15, 0.01);
  EXPECT_NEAR(static_cast<double>(mask_token) / masked, 0.8, 0.015);
  EXPECT_NEAR(static_cast<double>(kept) / masked, 0.1, 0.015);
  EXPECT_NEAR(static_cast<double>(masked - mask_token - kept) / masked, 0.1, 0.015);
  // Lengths uniform in [64, 128]: mean 96.
  EXPECT_NEAR(static_cast<double>(length_sum) / (400 * 8), 96.0, 1.0);
}

TEST(MlmData, MaskedRowBound) {
  EXPECT_EQ(max_masked_per_sequence(128), 19);  // round(0.15 * 126) = round(18.9)
  EXPECT_EQ(max_masked_per_sequence(512), 76);  // round(76.5) = 76, ties to even
  EXPECT_EQ(max_masked_per_sequence(16), 2);    // round(2.1)
  EXPECT_EQ(max_masked_per_sequence(3), 1);
  MlmDataOptions o;
  o.batch = 4;
  o.sequence = 512;
  o.min_length = 512;
  const MlmBatch full = make_mlm_batch(o, 0);
  for (int b = 0; b < 4; ++b) {
    int n = 0;
    for (int s = 0; s < 512; ++s) n += full.labels[b * 512 + s] != kIgnoreLabel;
    EXPECT_EQ(n, 76);  // 509 words (a pair): round(76.35)
  }
}

TEST(MlmData, GatheredRowsPadToThePlannedCount) {
  MlmDataOptions o;
  o.batch = 4;
  o.sequence = 128;
  o.seed = 3;
  const int rows = o.batch * max_masked_per_sequence(o.sequence);  // the memory plan's M
  for (uint64_t k = 0; k < 20; ++k) {
    const MlmBatch batch = make_mlm_batch(o, k);
    const GatheredRows gathered = gathered_rows(batch, rows);
    ASSERT_EQ(gathered.positions.size(), static_cast<size_t>(rows));
    ASSERT_EQ(gathered.labels.size(), static_cast<size_t>(rows));
    const size_t n = batch.masked_positions.size();
    ASSERT_LT(n, static_cast<size_t>(rows));  // padding to check (4 sequences rarely all reach 19 masks)
    // The masked positions first, with their labels.
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(gathered.positions[i], batch.masked_positions[i]);
      EXPECT_EQ(gathered.labels[i], batch.labels[batch.masked_positions[i]]);
    }
    // Then the lowest unmasked positions, ascending, ignored: 0, 1, ... skipping masked ones.
    int32_t expected = 0;
    for (size_t i = n; i < static_cast<size_t>(rows); ++i) {
      while (batch.labels[expected] != kIgnoreLabel) ++expected;
      EXPECT_EQ(gathered.positions[i], expected) << i;
      EXPECT_EQ(gathered.labels[i], kIgnoreLabel) << i;
      ++expected;
    }
    // All distinct (the gather's backward scatters): as a set, as many as rows.
    EXPECT_EQ(std::set<int32_t>(gathered.positions.begin(), gathered.positions.end()).size(),
              static_cast<size_t>(rows));
  }
  const MlmBatch batch = make_mlm_batch(o, 0);
  EXPECT_THROW(gathered_rows(batch, static_cast<int>(batch.masked_positions.size()) - 1), std::invalid_argument);
  EXPECT_THROW(gathered_rows(batch, -1), std::invalid_argument);
  // Every position of the batch: masked ones first, then all the others; one more cannot be distinct.
  const int tokens = o.batch * o.sequence;
  const GatheredRows all = gathered_rows(batch, tokens);
  EXPECT_EQ(std::set<int32_t>(all.positions.begin(), all.positions.end()).size(), static_cast<size_t>(tokens));
  EXPECT_EQ(*std::max_element(all.positions.begin(), all.positions.end()), tokens - 1);
  EXPECT_THROW(gathered_rows(batch, tokens + 1), std::invalid_argument);
  // Exactly the masked positions: no padding.
  const int masked = static_cast<int>(batch.masked_positions.size());
  EXPECT_EQ(gathered_rows(batch, masked).positions, batch.masked_positions);
}

TEST(MlmData, RejectsBadOptions) {
  MlmDataOptions o;
  o.sequence = 2;
  EXPECT_THROW(make_mlm_batch(o, 0), std::invalid_argument);
  o.sequence = 16;
  o.min_length = 2;
  EXPECT_THROW(make_mlm_batch(o, 0), std::invalid_argument);
  o.min_length = 10;
  o.max_length = 17;
  EXPECT_THROW(make_mlm_batch(o, 0), std::invalid_argument);
  o.max_length = 0;
  o.first_word = 50;
  EXPECT_THROW(make_mlm_batch(o, 0), std::invalid_argument);
  o.first_word = 999;
  o.mask_probability = 0;
  EXPECT_THROW(make_mlm_batch(o, 0), std::invalid_argument);
}

TEST(MlmData, WritesBatchesForThePeers) {
  MlmDataOptions o;
  o.batch = 3;
  o.sequence = 32;
  o.seed = 9;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("fusekit_mlm_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  write_mlm_batches(path, o, 5, 2);
  const SafetensorsFile file = SafetensorsFile::read(path);
  EXPECT_EQ(file.tensors().size(), 8u);
  for (uint64_t k : {5, 6}) {
    const MlmBatch batch = make_mlm_batch(o, k);
    const TensorView* ids = file.find(std::to_string(k) + ".input_ids");
    ASSERT_NE(ids, nullptr);
    EXPECT_EQ(ids->type, TensorType::i64);
    EXPECT_EQ(ids->shape, (std::vector<int64_t>{3, 32}));
    EXPECT_EQ(std::memcmp(ids->bytes.data(), batch.input_ids.data(), ids->bytes.size()), 0);
    const TensorView* labels = file.find(std::to_string(k) + ".labels");
    EXPECT_EQ(std::memcmp(labels->bytes.data(), batch.labels.data(), labels->bytes.size()), 0);
    const TensorView* lengths = file.find(std::to_string(k) + ".lengths");
    EXPECT_EQ(lengths->shape, (std::vector<int64_t>{3}));
    int64_t first;
    std::memcpy(&first, lengths->bytes.data(), 8);
    EXPECT_EQ(first, batch.lengths[0]);
  }
  bool has_seed = false;
  for (const auto& [key, value] : file.metadata()) has_seed |= key == "seed" && value == "9";
  EXPECT_TRUE(has_seed);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fusekit::models
