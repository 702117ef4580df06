// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011), and the dropout mask fusekit derives from it.
//
// Philox is counter-based: the random words are a pure function of (counter, key), so a kernel can
// draw element i's word anywhere, in any order, and the backward regenerates the forward's mask from
// (seed, offset) instead of storing it. The same code compiles for the device and the host, so the
// float64 references and the tests regenerate exactly the mask the kernels used.
//
// The dropout stream (seed, offset): the four words of
// philox4x32_10(counter = {g (low, high 32 bits), offset (low, high)}, key = seed (low, high)) are
// cut into eight 16-bit draws, and element i's draw is draw i % 8 of group g = i / 8: bits
// 16 (i % 2) .. 16 (i % 2) + 15 of word (i % 8) / 2. The element is kept iff its draw >=
// dropout_threshold(p) = round(p * 2^16), with probability 1 - round(p * 2^16) / 2^16, within 2^-17
// of 1 - p (FlashAttention draws 8 bits an element; 32 bits an element cost twice the Philox rounds,
// which took more instructions than the LayerNorm around them in the embedding forward).
// A fresh mask needs a fresh (seed, offset) pair: callers advance `offset` per call, or point
// `counter` at a device word the stream advances (offset + *counter, read when the kernel runs, so
// that one launch captured in a CUDA graph draws a fresh mask at every replay).
#pragma once

#include <cstdint>

#include "kernels/detail/fast_divide.h"  // multiply_high32, FUSEKIT_HOST_DEVICE

namespace fusekit::kernels {

struct PhiloxWords {
  uint32_t w[4];
};

// Ten rounds of the Philox4x32 bijection; the key is bumped by the Weyl constants between rounds.
FUSEKIT_HOST_DEVICE PhiloxWords philox4x32_10(PhiloxWords counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter.w[0], c1 = counter.w[1], c2 = counter.w[2], c3 = counter.w[3];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t high0 = multiply_high32(kMultiplier0, c0), low0 = kMultiplier0 * c0;
    const uint32_t high1 = multiply_high32(kMultiplier1, c2), low1 = kMultiplier1 * c2;
    c0 = high1 ^ c1 ^ key0;
    c1 = low1;
    c2 = high0 ^ c3 ^ key1;
    c3 = low0;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// The ten round keys of a key, computed once on the host. A kernel that draws many groups takes
// them as a kernel parameter: each round then reads its key from the constant bank as an operand
// of its XORs, instead of bumping the key in registers (two of a round's six instructions).
struct PhiloxKeys {
  uint32_t low[10];
  uint32_t high[10];
};

FUSEKIT_HOST_DEVICE PhiloxKeys philox_keys(uint64_t key) {
  PhiloxKeys keys{};
  uint32_t key0 = static_cast<uint32_t>(key), key1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    keys.low[round] = key0;
    keys.high[round] = key1;
    key0 += 0x9E3779B9u;  // the Weyl constants of philox4x32_10
    key1 += 0xBB67AE85u;
  }
  return keys;
}

// philox4x32_10 with the round keys of philox_keys(key): the same words. The rounds are written
// out again rather than shared through a helper: routing philox4x32_10's rounds through one changed
// the register allocation of the embedding and bias + dropout kernels that call it.
FUSEKIT_HOST_DEVICE PhiloxWords philox4x32_10(PhiloxWords counter, const PhiloxKeys& keys) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  uint32_t c0 = counter.w[0], c1 = counter.w[1], c2 = counter.w[2], c3 = counter.w[3];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t high0 = multiply_high32(kMultiplier0, c0), low0 = kMultiplier0 * c0;
    const uint32_t high1 = multiply_high32(kMultiplier1, c2), low1 = kMultiplier1 * c2;
    c0 = high1 ^ c1 ^ keys.low[round];
    c1 = low1;
    c2 = high0 ^ c3 ^ keys.high[round];
    c3 = low0;
  }
  return {{c0, c1, c2, c3}};
}

// The four words of the dropout stream for elements 8 * group .. 8 * group + 7.
FUSEKIT_HOST_DEVICE PhiloxWords dropout_words(uint64_t seed, uint64_t offset, uint64_t group) {
  const PhiloxWords counter{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                             static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Draw k (0..7) of a group's words.
FUSEKIT_HOST_DEVICE uint32_t dropout_draw(const PhiloxWords& words, int k) {
  return (words.w[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
}

// Draws below the threshold are dropped: round(p * 2^16), so p = 0 keeps every element and a p that
// rounds to 2^16 drops every one.
FUSEKIT_HOST_DEVICE uint32_t dropout_threshold(float p) {
  const double scaled = static_cast<double>(p) * 65536.0 + 0.5;
  return scaled >= 65536.0 ? 65536u : scaled <= 0.0 ? 0u : static_cast<uint32_t>(scaled);
}

// Whether element `index` of the stream (seed, offset) is kept.
FUSEKIT_HOST_DEVICE bool dropout_kept(uint64_t seed, uint64_t offset, uint64_t index, uint32_t threshold) {
  return dropout_draw(dropout_words(seed, offset, index >> 3), static_cast<int>(index & 7)) >= threshold;
}

// The kept flags of elements first .. first + N - 1 as bits 0 .. N - 1. For N a multiple of 8,
// `first` must be too, and each Philox call serves eight elements; for N = 4, `first` must be a
// multiple of 4 (the four lie in one group, one call).
template <int N>
FUSEKIT_HOST_DEVICE uint32_t dropout_kept_bits(uint64_t seed, uint64_t offset, uint64_t first, uint32_t threshold) {
  static_assert(N >= 1 && N <= 32, "one 32-bit word of flags");
  uint32_t bits = 0;
  if constexpr (N % 8 == 0) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int q = 0; q < N / 8; ++q) {
      const PhiloxWords words = dropout_words(seed, offset, (first >> 3) + q);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int k = 0; k < 8; ++k) bits |= static_cast<uint32_t>(dropout_draw(words, k) >= threshold) << (8 * q + k);
    }
  } else if constexpr (N == 4) {
    const PhiloxWords words = dropout_words(seed, offset, first >> 3);
    const int half = static_cast<int>((first >> 2) & 1);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 4; ++k) bits |= static_cast<uint32_t>(dropout_draw(words, 4 * half + k) >= threshold) << k;
  } else {
    for (int k = 0; k < N; ++k) bits |= static_cast<uint32_t>(dropout_kept(seed, offset, first + k, threshold)) << k;
  }
  return bits;
}

// As dropout_words, with the round keys of the seed.
FUSEKIT_HOST_DEVICE PhiloxWords dropout_words(const PhiloxKeys& keys, uint64_t offset, uint64_t group) {
  const PhiloxWords counter{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                             static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  return philox4x32_10(counter, keys);
}

// The kept flags of the eight elements of group `group` as bits 0 .. 7, with the round keys.
FUSEKIT_HOST_DEVICE uint32_t dropout_group_kept_bits(const PhiloxKeys& keys, uint64_t offset, uint64_t group,
                                                     uint32_t threshold) {
  const PhiloxWords words = dropout_words(keys, offset, group);
  uint32_t bits = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 8; ++k) bits |= static_cast<uint32_t>(dropout_draw(words, k) >= threshold) << k;
  return bits;
}

// The kept flags of elements first .. first + 7 as bits 0 .. 7, for any `first`: one Philox call,
// or two where the eight straddle two groups.
FUSEKIT_HOST_DEVICE uint32_t dropout_kept_bits8(const PhiloxKeys& keys, uint64_t offset, uint64_t first,
                                                uint32_t threshold) {
  const unsigned shift = static_cast<unsigned>(first & 7);
  uint32_t bits = dropout_group_kept_bits(keys, offset, first >> 3, threshold) >> shift;
  if (shift != 0) bits |= (dropout_group_kept_bits(keys, offset, (first >> 3) + 1, threshold) << (8 - shift)) & 0xFFu;
  return bits;
}

// One call's dropout, as the row kernels carry it: the stream (seed, offset), its threshold, and the
// kept elements' multiplier 1 / (1 - p). p = 0 draws no words and keeps every element with 1.
struct DropoutStream {
  uint64_t seed;
  uint64_t offset;
  uint32_t threshold;                 // draws below it are dropped (dropout_threshold)
  float scale;                        // 1 / (1 - p)
  bool dropping;                      // p > 0: draw words; otherwise every element is kept with multiplier 1
  const uint64_t* counter = nullptr;  // device; where set, the offset is offset + *counter

  // The stream's Philox counter offset. The counter is not written while a kernel runs, so the
  // read goes through the read-only path and stays in L1 after the first.
  FUSEKIT_HOST_DEVICE uint64_t offset_now() const {
#if defined(__CUDA_ARCH__)
    return counter ? offset + __ldg(reinterpret_cast<const unsigned long long*>(counter)) : offset;
#else
    return counter ? offset + *counter : offset;
#endif
  }
  // Kept flags of N elements from `first` (bit k: element first + k).
  template <int N>
  FUSEKIT_HOST_DEVICE uint32_t kept_bits(uint64_t first) const {
    return dropping ? dropout_kept_bits<N>(seed, offset_now(), first, threshold) : 0xFFFFFFFFu;
  }
  FUSEKIT_HOST_DEVICE float multiplier(uint32_t bits, int k) const { return (bits >> k) & 1u ? scale : 0.f; }
};

inline DropoutStream dropout_stream(float p, uint64_t seed, uint64_t offset, const uint64_t* counter = nullptr) {
  return {seed, offset, dropout_threshold(p), 1.f / (1.f - p), p > 0.f, counter};
}

}  // namespace fusekit::kernels
