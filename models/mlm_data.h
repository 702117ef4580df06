// Synthetic masked-LM batches, deterministic from a seed, the same for every variant and for the
// Python peers. The generator is specified here exactly, so that it can be written again in Python;
// write_mlm_batches also stores batches as safetensors of int64 tensors for the peers to read, and
// scripts/peers/mlm_data.py is this generator in Python (a CPU test compares the two).
//
// Random numbers: SplitMix64. state += 0x9E3779B97F4A7C15; z = state;
//   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB; next = z ^ (z >> 31)
// (all mod 2^64). below(n) = next % n; unit() = (next >> 11) * 2^-53, in [0, 1).
// Batch k of seed s starts from state = s ^ (k * 0xD1B54A32D192ED03 mod 2^64).
//
// Per sequence b = 0 .. batch-1, drawing in this order:
// 1. length L = min_length + below(max_length - min_length + 1) (defaults: min_length = max(3,
//    sequence / 2), max_length = sequence).
// 2. the tokens, positions 0 .. L-1: if L >= 5, a sentence pair: a = 1 + below(L - 4) words of the
//    first segment, then [CLS] w*a [SEP] w*(L-3-a) [SEP], the first a + 2 positions of token type 0,
//    the rest (up to L-1) of type 1. If L < 5: [CLS] w*(L-2) [SEP], all type 0. Each word w is
//    first_word + below(vocab - first_word), drawn in position order.
//    With echo (off by default), the second segment draws no words: its i-th word repeats the first
//    segment's (i mod a)-th, so a masked word whose partner is visible can be predicted through
//    attention (a learnable task for convergence tests; random words alone are not learnable).
//    Positions L .. sequence-1 are padding: id [PAD] = 0, token type 0, label -100.
// 3. masking, as BERT's create_pretraining_data: the W word positions (not [CLS], [SEP] or padding)
//    in position order form a list p; n = max(1, round_half_even(W * mask_probability)) of them are
//    chosen by a partial Fisher-Yates shuffle: for i = 0 .. n-1: j = i + below(W - i), swap p[i], p[j];
//    then for i = 0 .. n-1, position p[i]: label = its word; u = unit(): u < 0.8 -> [MASK] = 103,
//    else u < 0.9 -> first_word + below(vocab - first_word) (a random word), else the word is kept.
//    Every other label is -100 (the cross-entropy's ignore_index).
// So every sequence has at least one masked word (min_length >= 3 guarantees a word), and a batch
// has at most batch x max_masked_per_sequence(sequence) masked tokens: the fused step's bound for
// the gathered rows of the MLM head (models/memory_plan.h).
// The key-padding lengths are the L; positions are 0 .. sequence-1 in every sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusekit::models {

// BERT's uncased WordPiece vocabulary's special tokens.
inline constexpr int64_t kPadToken = 0;
inline constexpr int64_t kClsToken = 101;
inline constexpr int64_t kSepToken = 102;
inline constexpr int64_t kMaskToken = 103;
inline constexpr int64_t kIgnoreLabel = -100;  // torch.nn.functional.cross_entropy's ignore_index

struct MlmDataOptions {
  int batch = 1;
  int sequence = 128;  // >= 3
  int vocab = 30522;
  int min_length = 0;        // 0: max(3, sequence / 2); at least 3
  int max_length = 0;        // 0: sequence
  int64_t first_word = 999;  // words are drawn from [first_word, vocab): past [unused*] and the specials
  double mask_probability = 0.15;
  uint64_t seed = 0;
  bool echo = false;  // the second segment repeats the first (above)
};

struct MlmBatch {
  int batch = 0;
  int sequence = 0;
  std::vector<int64_t> input_ids;       // [batch, sequence]
  std::vector<int64_t> token_type_ids;  // [batch, sequence]
  std::vector<int64_t> labels;          // [batch, sequence]: the original word where masked, -100 elsewhere
  std::vector<int32_t> lengths;         // [batch]: real tokens per sequence (the attention's valid lengths)
  // Flat token indices b * sequence + s of the masked positions, ascending: the rows the MLM head
  // gathers. masked_labels are their labels, in the same order.
  std::vector<int32_t> masked_positions;
  std::vector<int64_t> masked_labels;
};

// The most masked words a sequence of this length can have: max(1, round(0.15 * (sequence - 2)))
// for the default probability (a sequence holds at most sequence - 2 words).
int max_masked_per_sequence(int sequence, double mask_probability = 0.15);

// The masked rows padded to a fixed count, for a step whose shapes do not change from batch to
// batch (buffers planned once, a CUDA graph): the MLM head gathers `rows` rows, the batch's masked
// positions (ascending) and then, as padding, the lowest flat positions that are not masked
// (ascending), with label -100, so the cross-entropy ignores them (they count neither in the mean
// nor in any gradient). Every position appears at most once: the gather's backward
// (kernels/gather_rows.h) scatters rather than sums, so its indices must be distinct. The planned
// count batch x max_masked_per_sequence(sequence) never exceeds the batch's batch x sequence
// positions; throws std::invalid_argument when `rows` does (or is negative), or when the batch has
// more masked positions than `rows`.
struct GatheredRows {
  std::vector<int32_t> positions;  // [rows]: flat token indices b * sequence + s
  std::vector<int64_t> labels;     // [rows]
};
GatheredRows gathered_rows(const MlmBatch& batch, int rows);

// Batch number `index` of the stream (options.seed). Throws std::invalid_argument for bad options.
MlmBatch make_mlm_batch(const MlmDataOptions& options, uint64_t index);

// Writes batches as safetensors: per batch k, tensors "<k>.input_ids", "<k>.token_type_ids",
// "<k>.labels" (I64 [batch, sequence]) and "<k>.lengths" (I64 [batch]); metadata records the options.
void write_mlm_batches(const std::string& path, const MlmDataOptions& options, uint64_t first_index, int count);

// The generator's random numbers, exposed for tests and for checking a Python port.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next();
  uint64_t below(uint64_t n) { return next() % n; }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }

 private:
  uint64_t state_;
};

}  // namespace fusekit::models
