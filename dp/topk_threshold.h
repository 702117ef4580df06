// The threshold search of the top-k selection (topk_selection.h), one layer at a time: the state
// that the counting passes fill and the two steps that read it. The kernels run these functions on
// the device (one thread per layer); the CPU test runs the same code against exact counts.
//
//   start: from the sample's estimate t0 of the k-th largest magnitude, 15 candidates
//          t0 * 2^((j - 7) / 8), j = 0..14 (1/8 octave apart, t0 itself among them), and one that
//          selects nothing;
//   step:  after a pass has counted count(t) = #{|x| >= t} for every candidate, accept the
//          candidate nearest k within [low, cap]; else keep the bracket (largest candidate with
//          count > cap, smallest with count < low) and the best candidate (largest count <= cap),
//          and place 15 new candidates evenly inside the bracket in float bits (about evenly in
//          log magnitude), or in half octaves beyond it where one side is missing, plus the best
//          one; on the last pass accept the best one of the pass.
// Candidates are float bit patterns of non-negative magnitudes, which order as the values do;
// kThresholdNothing lies above every magnitude's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FUSEKIT_HOST_DEVICE __host__ __device__
#else
#define FUSEKIT_HOST_DEVICE
#endif

namespace fusekit::dp {

constexpr int kThresholdCandidates = 16;
constexpr uint32_t kThresholdNothing = 0xFFFFFFFFu;

struct ThresholdSearch {
  int64_t k, low, cap;
  uint32_t candidates[kThresholdCandidates];
  unsigned long long counts[kThresholdCandidates];  // the counting pass adds into these
  uint32_t too_many_bits;                           // largest candidate seen with count > cap (valid if has_too_many)
  uint32_t too_few_bits;  // smallest candidate seen with count < low (kThresholdNothing at first)
  uint32_t best_bits;     // the candidate with the largest count <= cap seen so far
  int has_too_many;
  long long best_count;
  int done, chosen, passes;  // chosen: the accepted candidate's slot in the last pass counted
  uint32_t threshold_bits;
  long long count;
};

FUSEKIT_HOST_DEVICE inline uint32_t magnitude_bits_of(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits & 0x7FFFFFFFu;
}

// k = ceil(density * n) clamped to [1, n] (as selected_entries), the tolerance, the first candidates.
FUSEKIT_HOST_DEVICE inline void threshold_search_start(ThresholdSearch& s, int64_t n, double density, float estimate) {
  const int64_t k = static_cast<int64_t>(ceil(density * static_cast<double>(n)));
  s.k = k < 1 ? 1 : k > n ? n : k;
  s.low = s.k - s.k / 5;
  s.cap = s.k + s.k / 4;
  for (int j = 0; j < kThresholdCandidates - 1; ++j) {
    s.candidates[j] = magnitude_bits_of(estimate * exp2f(0.125f * static_cast<float>(j - 7)));
  }
  s.candidates[kThresholdCandidates - 1] = kThresholdNothing;
  for (int j = 0; j < kThresholdCandidates; ++j) s.counts[j] = 0;
  s.too_many_bits = 0;
  s.has_too_many = 0;
  s.too_few_bits = kThresholdNothing;
  s.best_bits = kThresholdNothing;
  s.best_count = -1;
  s.done = 0;
  s.chosen = kThresholdCandidates - 1;
  s.passes = 0;
  s.threshold_bits = kThresholdNothing;
  s.count = 0;
}

// After counting pass `pass` (from 0); `last`: no pass follows. Zeroes the counts for the next.
FUSEKIT_HOST_DEVICE inline void threshold_search_step(ThresholdSearch& s, int pass, bool last) {
  constexpr uint32_t kInfinityBits = 0x7F800000u;
  constexpr uint64_t kHalfOctave = uint64_t{1} << 22;  // half of an exponent step, in float bits
  if (s.done) return;
  s.passes = pass + 1;
  int pick = -1;
  long long pick_distance = 0;
  for (int j = 0; j < kThresholdCandidates; ++j) {
    const long long c = static_cast<long long>(s.counts[j]);
    const uint32_t b = s.candidates[j];
    if (c >= s.low && c <= s.cap) {
      const long long distance = c > s.k ? c - s.k : s.k - c;
      if (pick < 0 || distance < pick_distance) {
        pick = j;
        pick_distance = distance;
      }
    }
    if (c > s.cap) {
      if (!s.has_too_many || b > s.too_many_bits) s.too_many_bits = b;
      s.has_too_many = 1;
    } else {
      if (c > s.best_count) {
        s.best_bits = b;
        s.best_count = c;
      }
      if (c < s.low && b < s.too_few_bits) s.too_few_bits = b;
    }
  }
  if (pick < 0 && last) {
    // Out of passes: the largest count <= cap of this pass (the best so far is one of its candidates).
    for (int j = 0; j < kThresholdCandidates; ++j) {
      const long long c = static_cast<long long>(s.counts[j]);
      if (c <= s.cap && (pick < 0 || c > static_cast<long long>(s.counts[pick]))) pick = j;
    }
  }
  if (pick >= 0) {
    s.chosen = pick;
    s.threshold_bits = s.candidates[pick];
    s.count = static_cast<long long>(s.counts[pick]);
    s.done = 1;
    return;
  }
  for (int j = 0; j < kThresholdCandidates - 1; ++j) {
    uint32_t b;
    if (s.has_too_many && s.too_few_bits < kInfinityBits) {  // inside the bracket
      const uint64_t span = s.too_few_bits - s.too_many_bits;
      b = s.too_many_bits + static_cast<uint32_t>(span * static_cast<uint64_t>(j + 1) / kThresholdCandidates);
    } else if (s.has_too_many) {  // every candidate too many: half octaves up
      const uint64_t up = s.too_many_bits + static_cast<uint64_t>(j + 1) * kHalfOctave;
      b = up < kInfinityBits ? static_cast<uint32_t>(up) : kInfinityBits;
    } else {  // every candidate too few: half octaves down
      const uint64_t down = static_cast<uint64_t>(j + 1) * kHalfOctave;
      b = s.too_few_bits > down ? static_cast<uint32_t>(s.too_few_bits - down) : 0u;
    }
    s.candidates[j] = b;
  }
  s.candidates[kThresholdCandidates - 1] = s.best_bits;
  for (int j = 0; j < kThresholdCandidates; ++j) s.counts[j] = 0;
}

}  // namespace fusekit::dp
