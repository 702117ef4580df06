#include "models/mlm_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <stdexcept>

#include "models/safetensors.h"

namespace fusekit::models {
namespace {

struct Resolved {
  int min_length, max_length;
};

Resolved resolve(const MlmDataOptions& o) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("mlm data: " + what); };
  if (o.batch < 1) fail("batch must be >= 1");
  if (o.sequence < 3) fail("sequence must be >= 3 ([CLS], a word, [SEP])");
  if (o.first_word <= kMaskToken || o.first_word >= o.vocab) {
    fail("first_word must lie above [MASK] (103) and below vocab");
  }
  if (!(o.mask_probability > 0 && o.mask_probability <= 1)) fail("mask_probability must be in (0, 1]");
  Resolved r{o.min_length ? o.min_length : std::max(3, o.sequence / 2), o.max_length ? o.max_length : o.sequence};
  if (r.min_length < 3 || r.min_length > r.max_length || r.max_length > o.sequence) {
    fail("lengths must satisfy 3 <= min_length <= max_length <= sequence (got " + std::to_string(r.min_length) + ", " +
         std::to_string(r.max_length) + ", " + std::to_string(o.sequence) + ")");
  }
  return r;
}

int masked_count(int words, double probability) {
  return std::max(1, static_cast<int>(std::nearbyint(words * probability)));  // ties to even
}

}  // namespace

uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int max_masked_per_sequence(int sequence, double mask_probability) {
  return masked_count(std::max(sequence - 2, 1), mask_probability);
}

MlmBatch make_mlm_batch(const MlmDataOptions& o, uint64_t index) {
  const Resolved r = resolve(o);
  SplitMix64 random(o.seed ^ (index * 0xD1B54A32D192ED03ull));
  const auto word = [&] { return o.first_word + static_cast<int64_t>(random.below(o.vocab - o.first_word)); };
  MlmBatch out;
  out.batch = o.batch;
  out.sequence = o.sequence;
  const size_t tokens = static_cast<size_t>(o.batch) * o.sequence;
  out.input_ids.assign(tokens, kPadToken);
  out.token_type_ids.assign(tokens, 0);
  out.labels.assign(tokens, kIgnoreLabel);
  std::vector<int> words;
  for (int b = 0; b < o.batch; ++b) {
    const int length = r.min_length + static_cast<int>(random.below(r.max_length - r.min_length + 1));
    out.lengths.push_back(length);
    int64_t* ids = out.input_ids.data() + static_cast<size_t>(b) * o.sequence;
    int64_t* types = out.token_type_ids.data() + static_cast<size_t>(b) * o.sequence;
    int64_t* labels = out.labels.data() + static_cast<size_t>(b) * o.sequence;
    words.clear();
    ids[0] = kClsToken;
    ids[length - 1] = kSepToken;
    if (length >= 5) {
      const int a = 1 + static_cast<int>(random.below(length - 4));
      ids[a + 1] = kSepToken;
      for (int s = a + 2; s < length; ++s) types[s] = 1;
    }
    int first_words = 0;  // a, once the middle [SEP] is passed
    for (int s = 1; s < length - 1; ++s) {
      if (ids[s] == kSepToken) {
        first_words = s - 1;
        continue;
      }
      const bool echoed = o.echo && length >= 5 && first_words > 0;
      ids[s] = echoed ? ids[1 + (s - first_words - 2) % first_words] : word();
      words.push_back(s);
    }
    const int n =
        std::min(masked_count(static_cast<int>(words.size()), o.mask_probability), static_cast<int>(words.size()));
    for (int i = 0; i < n; ++i) {
      const int j = i + static_cast<int>(random.below(words.size() - i));
      std::swap(words[i], words[j]);
    }
    for (int i = 0; i < n; ++i) {
      const int s = words[i];
      labels[s] = ids[s];
      const double u = random.unit();
      if (u < 0.8) {
        ids[s] = kMaskToken;
      } else if (u < 0.9) {
        ids[s] = word();
      }
    }
  }
  for (size_t t = 0; t < tokens; ++t) {
    if (out.labels[t] != kIgnoreLabel) {
      out.masked_positions.push_back(static_cast<int32_t>(t));
      out.masked_labels.push_back(out.labels[t]);
    }
  }
  return out;
}

GatheredRows gathered_rows(const MlmBatch& batch, int rows) {
  const size_t tokens = static_cast<size_t>(batch.batch) * batch.sequence;
  if (rows < 0 || static_cast<size_t>(rows) > tokens) {
    throw std::invalid_argument("mlm data: " + std::to_string(rows) + " rows planned, but a batch of " +
                                std::to_string(batch.batch) + " x " + std::to_string(batch.sequence) + " has " +
                                std::to_string(tokens) + " positions");
  }
  if (static_cast<size_t>(rows) < batch.masked_positions.size()) {
    throw std::invalid_argument("mlm data: the batch has " + std::to_string(batch.masked_positions.size()) +
                                " masked positions, more than the " + std::to_string(rows) + " rows planned");
  }
  GatheredRows out{batch.masked_positions, batch.masked_labels};
  out.positions.reserve(rows);
  out.labels.reserve(rows);
  std::vector<bool> masked(tokens, false);
  for (int32_t t : batch.masked_positions) masked.at(static_cast<size_t>(t)) = true;
  // rows - masked padding positions exist among the tokens - masked unmasked ones (rows <= tokens).
  for (size_t t = 0; out.positions.size() < static_cast<size_t>(rows); ++t) {
    if (masked[t]) continue;
    out.positions.push_back(static_cast<int32_t>(t));
    out.labels.push_back(kIgnoreLabel);
  }
  return out;
}

void write_mlm_batches(const std::string& path, const MlmDataOptions& options, uint64_t first_index, int count) {
  const Resolved r = resolve(options);
  std::vector<MlmBatch> batches;
  std::vector<std::vector<int64_t>> lengths;
  for (int k = 0; k < count; ++k) {
    batches.push_back(make_mlm_batch(options, first_index + k));
    lengths.emplace_back(batches.back().lengths.begin(), batches.back().lengths.end());
  }
  const auto view = [](const std::vector<int64_t>& v) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(int64_t));
  };
  std::vector<TensorView> tensors;
  const std::vector<int64_t> shape = {options.batch, options.sequence};
  for (int k = 0; k < count; ++k) {
    const std::string prefix = std::to_string(first_index + k) + ".";
    tensors.push_back({prefix + "input_ids", TensorType::i64, shape, view(batches[k].input_ids)});
    tensors.push_back({prefix + "token_type_ids", TensorType::i64, shape, view(batches[k].token_type_ids)});
    tensors.push_back({prefix + "labels", TensorType::i64, shape, view(batches[k].labels)});
    tensors.push_back({prefix + "lengths", TensorType::i64, {options.batch}, view(lengths[k])});
  }
  char probability[32];
  std::snprintf(probability, sizeof probability, "%.17g", options.mask_probability);
  write_safetensors(path, tensors,
                    {{"generator", "fusekit models/mlm_data.h"},
                     {"batch", std::to_string(options.batch)},
                     {"sequence", std::to_string(options.sequence)},
                     {"vocab", std::to_string(options.vocab)},
                     {"min_length", std::to_string(r.min_length)},
                     {"max_length", std::to_string(r.max_length)},
                     {"first_word", std::to_string(options.first_word)},
                     {"mask_probability", probability},
                     {"seed", std::to_string(options.seed)},
                     {"echo", options.echo ? "1" : "0"},
                     {"first_index", std::to_string(first_index)},
                     {"count", std::to_string(count)}});
}

}  // namespace fusekit::models
