// Embedding + LayerNorm: what every kernel of the operator shares. A token's three ids and their
// tables (Lookup, Tables), the counts and order of the sorted backward (SortedTokens), the argument
// packs of the forward and backward row kernels, and the float additions of de into float rows.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/detail/layernorm_common.cuh"
#include "kernels/detail/philox.cuh"

namespace fusekit::kernels {
// Included by embedding_layernorm.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

using namespace layernorm_rows;

// The ids of one token, and whether all three are inside their tables.
struct TokenIds {
  int64_t word, position, type;
  bool in_range;
};

struct Lookup {
  const int64_t* word_ids;
  const int64_t* position_ids;
  const int64_t* type_ids;
  int vocab;
  int positions;
  int types;
  __device__ __forceinline__ TokenIds at(int row) const {
    TokenIds ids{word_ids[row], position_ids[row], type_ids[row], false};
    ids.in_range = ids.word >= 0 && ids.word < vocab && ids.position >= 0 && ids.position < positions &&
                   ids.type >= 0 && ids.type < types;
    return ids;
  }
};

// e = word + position + type with rounded adds: the forward and the backward agree to the bit.
__device__ __forceinline__ float embedding_sum(float word, float position, float type) {
  return __fadd_rn(__fadd_rn(word, position), type);
}

template <class T>
struct Tables {
  const T* word;
  const T* position;
  const T* type;
  // Element c of token `ids`' e.
  __device__ __forceinline__ float e_at(const TokenIds& ids, int C, int c) const {
    return embedding_sum(to_float(word[ids.word * C + c]), to_float(position[ids.position * C + c]),
                         to_float(type[ids.type * C + c]));
  }
};

// What the sorted backward keeps besides BackwardArgs: per word id, how many tokens use it and, for a
// word used more than once, the token whose float row of word_sums collects its de; the tokens in
// position order, each with its ids and that row (or -1).
struct SortedTokens {
  int* count;       // [vocab]: tokens with this word id (all three ids in range); zeroed before
  int* pcount;      // [positions + 1]: tokens per position id, the last for ids out of range; zeroed
  int* second;      // [vocab]: the second token to use a word: its row of word_sums sums the word
  int* rank;        // [tokens]: a token's place among the tokens of its position
  int4* entries;    // [tokens]: (token, word, position, type) by position; word -1: out of range
  int* entry_rows;  // [tokens]: the word_sums row of the entry's word, or -1 for a word used once
  int* repeated;    // [1]: how many words are used more than once; zeroed
  int2* pairs;      // [vocab]: those words, each with its second token (the word_sums row that sums it)
};

// Counts token r (ids `ids`): its word and position ids, its rank within its position; the second
// token of a word notes itself as the word's (second). In two steps, so that a caller can have other loads
// in flight while the counts come back: the two atomics (in flight at once: neither waits for the
// other), then what needs their answers.
struct TokenCount {
  int rank;  // among the tokens of its position
  int uses;  // tokens of its word counted before it; -1: ids out of range
};
__device__ __forceinline__ TokenCount count_token_atomics(const TokenIds& ids, const SortedTokens& s, int positions) {
  return {atomicAdd(s.pcount + (ids.in_range ? ids.position : positions), 1),
          ids.in_range ? atomicAdd(s.count + ids.word, 1) : -1};
}
__device__ __forceinline__ void count_token_finish(const TokenCount& n, const TokenIds& ids, int r,
                                                   const SortedTokens& s) {
  s.rank[r] = n.rank;
  if (n.uses == 1) s.second[ids.word] = r;
}
__device__ __forceinline__ void count_token(const TokenIds& ids, int r, const SortedTokens& s, int positions) {
  count_token_finish(count_token_atomics(ids, s, positions), ids, r, s);
}

// Zeroes the C floats at `row` with `threads` threads, this one `t`.
__device__ __forceinline__ void zero_floats(float* row, int C, int t, int threads) {
  if (C % 4 == 0) {
    for (int c = 4 * t; c < C; c += 4 * threads) *reinterpret_cast<float4*>(row + c) = make_float4(0.f, 0.f, 0.f, 0.f);
  } else {
    for (int c = t; c < C; c += threads) row[c] = 0.f;
  }
}

template <class T>
struct ForwardArgs {
  Lookup lookup;
  Tables<T> tables;
  const T* gamma;
  const T* beta;
  T* y;
  float* mean;
  float* rstd;
  int rows;
  int C;
  float eps;
  DropoutStream dropout;
  SortedTokens sort;  // count_ids: where the ids are counted for the backward (count_token)
  bool count_ids;
};

template <class T>
struct BackwardArgs {
  Lookup lookup;
  Tables<T> tables;
  const T* dy;
  const T* gamma;
  const float* mean;
  const float* rstd;
  const int* slot;    // [vocab]: the accumulator row of a word id
  float* word_sums;   // [slots, C]
  float* small_sums;  // [positions + types, C]: position rows, then token-type rows
  float* partial;     // [gridDim.x][2][C]: per block, sums of dy' * xhat (dgamma) and dy' (dbeta)
  int rows;
  int C;
  int type_sums_offset;  // floats into dynamic shared memory of the per-block token-type sums; -1: none
  DropoutStream dropout;
};

// Adds N floats to global memory at `to` (16-byte aligned where N is a multiple of 4).
template <int N>
__device__ __forceinline__ void add_floats(float* to, const float* values) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kFloat4 = N % 4 == 0;
#else
  constexpr bool kFloat4 = false;
#endif
  if constexpr (kFloat4) {
#pragma unroll
    for (int q = 0; q < N / 4; ++q)
      atomicAdd(reinterpret_cast<float4*>(to) + q,
                make_float4(values[4 * q], values[4 * q + 1], values[4 * q + 2], values[4 * q + 3]));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) atomicAdd(to + k, values[k]);
  }
}

}  // namespace
}  // namespace fusekit::kernels
