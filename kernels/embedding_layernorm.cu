// Embedding + LayerNorm + dropout forward and backward (see embedding_layernorm.h for the math, the
// layouts and what out-of-range ids do).
//
// Design: LayerNorm's row kernels (layernorm_common.cuh) whose loads gather three table rows. The
// row lives in registers; e is summed with rounded adds so the backward's recomputation is the
// forward's bit for bit; the dropout words are drawn per vector (kernels/philox.cuh), never stored.
//
// The backward of rows of 33..256 16-byte vectors (BERT's 768 and 1024 columns) sorts the tokens by
// position first, so that neither table gradient needs an atomic per token:
//   1. one kernel zeroes the counters; a thread a token counts the tokens of each word and position
//      id, ranks each token within its position, and notes each word's second token (whose float
//      row will sum the word if it is used more than once). In training the forward, given the
//      backward's workspace, counts while its rows load (the zeroing kernel before it, the counts by
//      a row group's first thread), and the backward starts at step 2 (H100, fp16, forward +
//      backward, A/B in one process: 8192 x 768 57.7-58.0 -> 55.7-55.8 us, 8192 x 1024 74.1 ->
//      72.4-72.5, 16384 x 768 89.2-89.3 -> 86.7-86.9, 16384 x 1024 118.2-118.5 -> 117.7-117.9);
//   2. the blocks of the scatter each scan the position counts in shared memory and write the
//      tokens' ids in position order; beside them, two blocks an SM zero the float rows of the
//      repeated words and the position and type float sums;
//   3. the row kernel (16-bit types at 768 and 1024 columns: a group of 3 or 4 warps a token, a
//      16-byte vector a lane, on a run of the order; other rows: G row groups a block, each on
//      every G-th token of the block's run):
//      LayerNorm backward; de of a word used once (most words of a batch) is stored, rounded once,
//      straight into dword; de of a word used more than once is added with float atomics into its
//      float row; the de of a run of one position are summed in registers and added once per run;
//      the token types and dgamma/dbeta are summed per warp or per block in shared memory. The
//      block also zeroes the dword rows of its share of the vocabulary that no token uses;
//   4. the dword rows of repeated words and the position and type rows are converted from their
//      float sums; the dgamma/dbeta partial rows are summed.
// H100, fp16, 8192 x 768 (the suite's BERT tables and ids): the backward 107.3 -> 80.7 us against
// the unsorted one below, which added every de with float atomics into a compact float row per
// distinct word and into the position rows, then converted all three tables (16384 x 1024:
// 230.4 -> 167.0 us). Other rows (and position tables of more than kMaxSortedPositions rows) take
// that unsorted backward:
//   1. zero the accumulators; mark the word ids in use; give each marked id a compact slot (an
//      accumulator row) from a counter, one atomic per warp (slot order is arbitrary: the sums in a
//      slot do not depend on it);
//   2. the row kernel: LayerNorm backward, dgamma/dbeta partials per block (no atomics), de added
//      with float atomics (16-byte float4 atomics on sm_90) into the slot of its word id and into the
//      position rows; the token-type rows (a handful, hit by every token) are summed per block in
//      shared memory first, so that their atomics do not all land on the same few addresses;
//   3. one pass writes every row of the three gradient tables once, converted or zero; a second
//      sums the dgamma/dbeta partials.
// Rows too long for the register configurations take looping kernels (a block per row, e gathered
// again in each pass).
#include "kernels/embedding_layernorm.h"
#include "kernels/layernorm_common.cuh"
#include "kernels/philox.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
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

// ---- CUDA kernels

// COLUMNS > 0: the row length compiled in (BERT's 768 and 1024 with a warp a row): the row's loads
// are all issued first, with no branch around them, and its dropout flags drawn while they fly.
// With a run-time length the same order took 96 registers against 60 (and was slower).
// kCount: a.count_ids (a separate build, so that the forward alone keeps its registers: 77 against
// the counting build's 80 at 1024 columns).
template <class T, int VEC, int NV, int TPR, int COLUMNS = 0, bool kCount = false>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    embedding_layernorm_forward_kernel(const ForwardArgs<T> a) {
  if constexpr (kCount) wait_for_prior_grid();  // the zeroed counters (launch_after_prior)
  __shared__ float scratch[kWarpSize];
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = COLUMNS > 0 ? COLUMNS : a.C;
  // With the width compiled in and 16-bit elements (a vector is one group of eight draws), the
  // Philox words are kept as drawn, and each element's flag is compared where y is formed: packing
  // the flags into bits and unpacking them cost more instructions than the registers they save.
  constexpr bool kDrawnWords = COLUMNS > 0 && VEC == 8;
  // Three vectors a lane (768 columns) also draw the words before the table loads and compare the
  // draws in place without extracting them (both below). With four (1024 columns) the in-place
  // compares took 110 registers against 77, and drawing first measured slower.
  constexpr bool kThreeVectors = kDrawnWords && NV == 3;

  // The whole warp runs every iteration (its shuffles need every lane); a row group past the last
  // row, or on a token with an id out of range, gathers nothing.
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const bool valid = row < a.rows;
    const TokenIds ids = valid ? a.lookup.at(row) : TokenIds{0, 0, 0, false};
    const bool gather = valid && ids.in_range;
    // Training: the ids counted for the backward. With three vectors a lane the atomics go ahead of
    // the table loads; elsewhere after them (at 1024 columns ahead took 104 registers against 80).
    constexpr bool kCountFirst = kCount && kThreeVectors;
    TokenCount counted{};
    if (kCountFirst && t == 0 && valid) counted = count_token_atomics(ids, a.sort, a.lookup.positions);
    const size_t base = static_cast<size_t>(row) * C;
    const DropoutStream& dropout = a.dropout;
    uint32_t kept[NV];
    PhiloxWords drawn[NV];  // kDrawnWords: a vector's eight draws, compared where y is formed
    float v[NV][VEC];
    float sum = 0.f;
    if constexpr (COLUMNS > 0) {
      const T* word = a.tables.word + (gather ? ids.word : 0) * C;
      const T* position = a.tables.position + (gather ? ids.position : 0) * C;
      const T* type = a.tables.type + (gather ? ids.type : 0) * C;
      // kThreeVectors: the words are drawn first, in the source, while the ids load (the table rows'
      // addresses wait for them). Drawn after the table loads, as the other configurations do,
      // the compiler scheduled part of e's sums (which wait for the rows) ahead of Philox, and the
      // warp stalled before it: H100, fp16, 8192 x 768, in one process, 14.9 against 14.1 us. At
      // 1024 columns drawing first was slower in the suite (8192 x 1024: 18.9 against 20.1 us).
      auto draw = [&] {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
          drawn[j] = dropout.dropping ? dropout_words(dropout.seed, dropout.offset, (base + (j * TPR + t) * VEC) >> 3)
                                      : PhiloxWords{{0u, 0u, 0u, 0u}};  // threshold 0: all kept
        }
      };
      if constexpr (kThreeVectors) draw();
      V w[NV], p[NV], ty[NV];
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        w[j] = V::load(word + c);
        p[j] = V::load(position + c);
        ty[j] = V::load(type + c);
      }
      if constexpr (kDrawnWords && !kThreeVectors) {
        draw();
      } else if constexpr (!kDrawnWords) {
#pragma unroll
        for (int j = 0; j < NV; ++j) kept[j] = dropout.template kept_bits<VEC>(base + (j * TPR + t) * VEC);
      }
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          v[j][k] = gather ? embedding_sum(to_float(w[j].v[k]), to_float(p[j].v[k]), to_float(ty[j].v[k])) : 0.f;
          sum += v[j][k];
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        if (gather && c < C) {
          const V w = V::load(a.tables.word + ids.word * C + c);
          const V p = V::load(a.tables.position + ids.position * C + c);
          const V ty = V::load(a.tables.type + ids.type * C + c);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            v[j][k] = embedding_sum(to_float(w.v[k]), to_float(p.v[k]), to_float(ty.v[k]));
            sum += v[j][k];
          }
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[j][k] = 0.f;
        }
      }
      // The dropout flags are drawn here, before the reductions, where Philox's multiplies overlap
      // their shuffles (they were drawn at the stores, after both).
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        kept[j] = c < C ? dropout.template kept_bits<VEC>(base + c) : 0u;
      }
    }
    // Training: the ids counted for the backward while the rows load.
    if (kCount && !kCountFirst && t == 0 && valid) counted = count_token_atomics(ids, a.sort, a.lookup.positions);
    if (kCount && t == 0 && valid) count_token_finish(counted, ids, row, a.sort);
    float mu, rs;
    if constexpr (kDrawnWords) {
      // One pass: the mean from the plain sum (the two-pass mean, bit for bit), the variance from
      // squares about the row's first element K, var = mean((e - K)^2) - (mean - K)^2, both sums in
      // the same shuffle rounds. The shift keeps the subtraction benign (|mean - K| is of the order
      // of the row's deviation), and the second reduction no longer waits for the first.
      const float shift = __shfl_sync(0xffffffffu, v[0][0], 0);
      float squares = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = v[j][k] - shift;
          squares = fmaf(d, d, squares);
        }
      }
#pragma unroll
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        squares += __shfl_xor_sync(0xffffffffu, squares, offset);
      }
      mu = sum / C;
      const float dk = mu - shift;
      rs = rsqrtf(fmaxf(squares / C - dk * dk, 0.f) + a.eps);
    } else {
      mu = reduce(sum) / C;
      float squares = 0.f;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        if (gather && (j * TPR + t) * VEC < C) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) squares += (v[j][k] - mu) * (v[j][k] - mu);
        }
      }
      rs = rsqrtf(reduce(squares) / C + a.eps);
    }
    if (!valid) continue;  // after the reductions: every lane took part in them
    // kDrawnWords: xhat = e * rstd - mean * rstd, one fma; against (e - mean) * rstd it adds an
    // error of about 2^-24 |mean| rstd, below 2^-10 (16-bit y's rounding) unless |mean| exceeds
    // 2^14 times the row's deviation. kThreeVectors: each 16-bit draw is compared in its word:
    // the high one as word >= threshold << 16, the low one as (word << 16) >= threshold << 16; a
    // threshold of 2^16 (every element dropped) does not fit that shift and is tested on its own.
    const float neg_mu_rs = -mu * rs;
    const uint32_t threshold_high = dropout.threshold << 16;
    const bool drop_all = dropout.threshold > 0xFFFFu;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (c < C) {
        const V g = V::load(a.gamma + c), b = V::load(a.beta + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          if constexpr (kDrawnWords) {
            const float ln = fmaf(v[j][k], rs, neg_mu_rs) * to_float(g.v[k]) + to_float(b.v[k]);
            const uint32_t word = drawn[j].w[k >> 1];
            const bool keep = kThreeVectors ? !drop_all && ((k & 1) ? word : word << 16) >= threshold_high
                                            : dropout_draw(drawn[j], k) >= dropout.threshold;
            out.v[k] = from_float<T>(gather ? (keep ? ln * dropout.scale : 0.f) : NAN);
          } else {
            const float ln = (v[j][k] - mu) * rs * to_float(g.v[k]) + to_float(b.v[k]);
            out.v[k] = from_float<T>(gather ? ln * dropout.multiplier(kept[j], k) : NAN);
          }
        }
        out.store(a.y + base + c);
      }
    }
    if (t == 0) {
      a.mean[row] = gather ? mu : NAN;
      a.rstd[row] = gather ? rs : NAN;
    }
  }
}

// Any row length: a block per row; e is gathered again in each pass.
template <class T>
__global__ void embedding_layernorm_forward_looping_kernel(const ForwardArgs<T> a) {
  wait_for_prior_grid();  // count_ids: the zeroed counters (launch_after_prior)
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * C;
    const TokenIds ids = a.lookup.at(row);
    if (a.count_ids && threadIdx.x == 0) count_token(ids, row, a.sort, a.lookup.positions);  // training
    if (!ids.in_range) {  // the whole block takes this branch
      for (int c = threadIdx.x; c < C; c += blockDim.x) a.y[base + c] = from_float<T>(NAN);
      if (threadIdx.x == 0) a.mean[row] = a.rstd[row] = NAN;
      continue;
    }
    float sum = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += a.tables.e_at(ids, C, c);
    const float mu = block_sum(sum, scratch) / C;
    float squares = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = a.tables.e_at(ids, C, c) - mu;
      squares += d * d;
    }
    const float rs = rsqrtf(block_sum(squares, scratch) / C + a.eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float ln = (a.tables.e_at(ids, C, c) - mu) * rs * to_float(a.gamma[c]) + to_float(a.beta[c]);
      const float m = a.dropout.multiplier(a.dropout.template kept_bits<1>(base + c), 0);
      a.y[base + c] = from_float<T>(ln * m);
    }
    if (threadIdx.x == 0) {
      a.mean[row] = mu;
      a.rstd[row] = rs;
    }
  }
}

// mark[word id] = 1 for every token whose ids are in range.
__global__ void mark_words_kernel(Lookup lookup, int rows, int* mark) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    const TokenIds ids = lookup.at(r);
    if (ids.in_range) mark[ids.word] = 1;
  }
}

// slot[v] for every marked v: 0, 1, ... from `counter` (zeroed with the marks), one atomicAdd per
// warp. Unmarked entries are left as they are (no reader looks at them).
__global__ void word_slots_kernel(const int* __restrict__ mark, int* __restrict__ slot, int n, int* counter) {
  wait_for_prior_grid();  // the marks: launch_after_prior
  const int lane = threadIdx.x % kWarpSize;
  for (int first = blockIdx.x * blockDim.x; first < n; first += gridDim.x * blockDim.x) {
    const int v = first + threadIdx.x;  // the whole warp runs every iteration (its ballot needs it)
    const bool marked = v < n && mark[v] != 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, marked);
    if (ballot == 0) continue;
    int base = 0;
    if (lane == 0) base = atomicAdd(counter, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (marked) slot[v] = base + __popc(ballot & ((1u << lane) - 1u));
  }
}

template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    embedding_layernorm_backward_kernel(const BackwardArgs<T> a) {
  wait_for_prior_grid();  // the slots: launch_after_prior
  __shared__ float scratch[kWarpSize];
  extern __shared__ float dynamic_shared[];  // [warps][2][C] (lanes per row), then [types][C] type sums
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = a.C;
  const int types = a.lookup.types, positions = a.lookup.positions;
  float* type_sums = a.type_sums_offset >= 0 ? dynamic_shared + a.type_sums_offset : nullptr;
  if (type_sums) {
    for (int i = threadIdx.x; i < types * C; i += blockDim.x) type_sums[i] = 0.f;
    __syncthreads();
  }

  // dgamma, dbeta of this thread's columns; a warp per row keeps them in shared memory (ColumnSums).
  ColumnSums<2, NV, VEC, TPR, TPR == kWarpSize> sums(dynamic_shared, C);
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const TokenIds ids = row < a.rows ? a.lookup.at(row) : TokenIds{0, 0, 0, false};
    const bool valid = row < a.rows && ids.in_range;  // out of range: no gradient at all
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = valid ? a.mean[row] : 0.f, rs = valid ? a.rstd[row] : 0.f;
    // e in float and the kept flags stay in registers; dy is loaded again by the second pass (plain
    // loads, so it is an L1 hit) rather than held, which keeps bf16 rows of 768 free of spills.
    float ev[NV][VEC];
    uint32_t kept[NV];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      kept[j] = 0;
      if (valid && c < C) {
        kept[j] = a.dropout.template kept_bits<VEC>(base + c);
        const V w = V::load(a.tables.word + ids.word * C + c);
        const V p = V::load(a.tables.position + ids.position * C + c);
        const V ty = V::load(a.tables.type + ids.type * C + c);
        const V dyv = V::load(a.dy + base + c);
        const V gv = V::load(a.gamma + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          ev[j][k] = embedding_sum(to_float(w.v[k]), to_float(p.v[k]), to_float(ty.v[k]));
          const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept[j], k));
          const float xhat = (ev[j][k] - mu) * rs;
          // Rounded products, so both passes see the same g (no FMA contraction in one of them).
          const float g = __fmul_rn(d, to_float(gv.v[k]));
          sum_g += g;
          sum_gx += g * xhat;
          sums.add(0, j, k, d * xhat);
          sums.add(1, j, k, d);
        }
      }
    }
    const float mean_g = reduce(sum_g) / C;
    const float mean_gx = reduce(sum_gx) / C;
    if (valid) {
      float* word_to = a.word_sums + static_cast<size_t>(a.slot[ids.word]) * C;
      float* position_to = a.small_sums + static_cast<size_t>(ids.position) * C;
      float* type_to =
          type_sums ? type_sums + ids.type * C : a.small_sums + static_cast<size_t>(positions + ids.type) * C;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        if (c < C) {
          const V gv = V::load(a.gamma + c), dyv = V::load(a.dy + base + c);
          float de[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept[j], k));
            const float xhat = (ev[j][k] - mu) * rs;
            const float g = __fmul_rn(d, to_float(gv.v[k]));
            de[k] = rs * (g - mean_g - xhat * mean_gx);
          }
          add_floats<VEC>(word_to + c, de);
          add_floats<VEC>(position_to + c, de);
          if (type_sums) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              if constexpr (RowGroups<TPR>::kLanesPerRow)
                atomicAdd(type_to + c + k, de[k]);  // the block's warps share the rows
              else
                type_to[c + k] += de[k];  // the block is on one row: each column has one owner thread
            }
          } else {
            add_floats<VEC>(type_to + c, de);
          }
        }
      }
    }
  }

  sums.write(a.partial + static_cast<size_t>(blockIdx.x) * 2 * C, dynamic_shared, C, t);
  if (type_sums) {
    __syncthreads();
    float* to = a.small_sums + static_cast<size_t>(positions) * C;
    for (int i = threadIdx.x; i < types * C; i += blockDim.x) {
      if (type_sums[i] != 0.f) atomicAdd(to + i, type_sums[i]);
    }
  }
}

// Any row length: a block per row. The block's partial rows accumulate in global memory, which only
// this block touches (each column has one owner thread in every row); de goes straight to the
// accumulators.
template <class T>
__global__ void embedding_layernorm_backward_looping_kernel(const BackwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  float* block_partial = a.partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) block_partial[c] = 0.f;
  __syncthreads();
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const TokenIds ids = a.lookup.at(row);
    if (!ids.in_range) continue;  // the whole block takes this branch
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = a.mean[row], rs = a.rstd[row];
    auto d_at = [&](int c) {
      return __fmul_rn(to_float(a.dy[base + c]), a.dropout.multiplier(a.dropout.template kept_bits<1>(base + c), 0));
    };
    float sum_g = 0.f, sum_gx = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = d_at(c), xhat = (a.tables.e_at(ids, C, c) - mu) * rs;
      const float g = __fmul_rn(d, to_float(a.gamma[c]));
      sum_g += g;
      sum_gx += g * xhat;
      block_partial[c] += d * xhat;
      block_partial[C + c] += d;
    }
    const float mean_g = block_sum(sum_g, scratch) / C;
    const float mean_gx = block_sum(sum_gx, scratch) / C;
    float* word_to = a.word_sums + static_cast<size_t>(a.slot[ids.word]) * C;
    float* position_to = a.small_sums + static_cast<size_t>(ids.position) * C;
    float* type_to = a.small_sums + static_cast<size_t>(a.lookup.positions + ids.type) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (a.tables.e_at(ids, C, c) - mu) * rs;
      const float g = __fmul_rn(d_at(c), to_float(a.gamma[c]));
      const float de = rs * (g - mean_g - xhat * mean_gx);
      atomicAdd(word_to + c, de);
      atomicAdd(position_to + c, de);
      atomicAdd(type_to + c, de);
    }
  }
}

// ---- The sorted backward (a block per row, position tables of up to kMaxSortedPositions rows)

// Zeroes n float4s: thread `thread` of `threads` takes every threads-th from its own.
__device__ __forceinline__ void zero_float4s(float4* __restrict__ to, int n, int thread, int threads) {
  for (int i = thread; i < n; i += threads) to[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// Zeroes n float4s: the sorted backward's counters. A kernel rather than a memset, so that it, and
// the counting kernel (or forward) after it, launch as programmatic dependents.
__global__ void zero_float4s_kernel(float4* __restrict__ to, int n) {
  wait_for_prior_grid();  // the kernel before may still read this workspace: launch_after_prior
  zero_float4s(to, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// A thread a token: count_token.
__global__ void count_tokens_kernel(Lookup lookup, int rows, SortedTokens s) {
  wait_for_prior_grid();  // the zeroed counters: launch_after_prior
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
    count_token(lookup.at(r), r, s, lookup.positions);
}

// The scan and the scatter of order_tokens_kernel, by its first `blocks` blocks: the block's first
// token (ids `first_ids`, loaded before the wait) has its rank, count and second loaded before the
// scan, so that those loads fly while the block scans.
__device__ __forceinline__ void order_tokens(const Lookup& lookup, int rows, const SortedTokens& s, int blocks,
                                             int first_row, const TokenIds& first_ids) {
  extern __shared__ int first_entry[];
  __shared__ int warp_totals[kWarpSize];
  int first_rank = 0, first_count = 0, first_second = 0;
  if (first_row < rows) {
    first_rank = s.rank[first_row];
    if (first_ids.in_range) {
      first_count = s.count[first_ids.word];
      first_second = s.second[first_ids.word];
    }
  }
  const int n = lookup.positions + 1, per_thread = ceil_div(n, static_cast<int>(blockDim.x));
  const int begin = threadIdx.x * per_thread, end = min(begin + per_thread, n);
  int total = 0;
  for (int i = begin; i < end; ++i) total += s.pcount[i];
  // Exclusive scan of the threads' totals: within warps by shuffles, then over the warps.
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int inclusive = total;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  int before = inclusive - total;
  for (int w = 0; w < warp; ++w) before += warp_totals[w];
  for (int i = begin; i < end; ++i) {
    first_entry[i] = before;
    before += s.pcount[i];
  }
  __syncthreads();
  for (int r = first_row; r < rows; r += blocks * blockDim.x) {
    const bool first = r == first_row;
    const TokenIds ids = first ? first_ids : lookup.at(r);
    const int rank = first ? first_rank : s.rank[r];
    const int count = first ? first_count : (ids.in_range ? s.count[ids.word] : 0);
    const int second = first ? first_second : (ids.in_range ? s.second[ids.word] : 0);
    const int at = first_entry[ids.in_range ? ids.position : lookup.positions] + rank;
    s.entries[at] = ids.in_range ? make_int4(r, static_cast<int>(ids.word), static_cast<int>(ids.position),
                                             static_cast<int>(ids.type))
                                 : make_int4(r, -1, 0, 0);
    s.entry_rows[at] = ids.in_range && count > 1 ? second : -1;
  }
}

// Blocks [0, token_blocks): entries[first entry of position p + rank] = the token's ids, with the
// first entries from an exclusive scan of pcount that each of these blocks does for itself in shared
// memory (positions + 1 ints). The other blocks, beside them: the words used more than once, 32 at
// a time a warp, by their counts: their word_sums rows (a row per repeated word: its second
// token's) zeroed, and the words listed for sorted_gradients_kernel, a place in the list for the
// warp's words taken with one atomic; then the position and type float sums zeroed. (The list is
// built here rather than by the counting, where each word's second token would wait for the
// counter. The counter starts from zero only after the counters' zeroing: a second backward on the
// forward's counts (embedding_layernorm.h) appends the same words again after the first list, and
// only the list's first vocab places are written and read. The sweep reads second[] of every word,
// written only for words used more than once: the others' values go unused.) H100, fp16, forward +
// backward, A/B in one call: against the sweep done by every block after its tokens, 8192 x 768
// 56.6-56.8 -> 55.1-55.2 us (this kernel 5.3 -> 3.8 us); two sweep blocks an SM against one,
// 16384 x 768 85.8-86.1 -> 85.2-85.4 us. Tried and dropped: the sweep also zeroing the dword rows of unused words (the
// row kernel no longer zeroing them): this kernel took 15-18 us and the row kernel lost only 7-9 (8192 x 768 54.9
// -> 58.0-62.1 us, 16384 x 768 86.4 -> 90.8-91.0).
__global__ void order_tokens_kernel(Lookup lookup, int rows, SortedTokens s, float* __restrict__ word_sums, int C,
                                    float4* __restrict__ small_sums, int small_float4s, int token_blocks) {
  if (static_cast<int>(blockIdx.x) < token_blocks) {
    // The first token's ids before the wait: they are inputs, not the counts' results.
    const int first_row = blockIdx.x * blockDim.x + threadIdx.x;
    const TokenIds first_ids = lookup.at(min(first_row, rows - 1));
    wait_for_prior_grid();  // the counts: launch_after_prior
    order_tokens(lookup, rows, s, token_blocks, first_row, first_ids);
    return;
  }
  wait_for_prior_grid();  // the counts: launch_after_prior
  const int block = blockIdx.x - token_blocks, blocks = gridDim.x - token_blocks;
  const int lane = threadIdx.x % kWarpSize, warps = blocks * blockDim.x / kWarpSize;
  for (int first = (block * blockDim.x + threadIdx.x) / kWarpSize * kWarpSize; first < lookup.vocab;
       first += warps * kWarpSize) {
    const int word = first + lane;
    const int row = word < lookup.vocab ? s.second[word] : 0;  // read with the count: used if it is > 1
    const bool many = word < lookup.vocab && s.count[word] > 1;
    const uint32_t repeated = __ballot_sync(0xffffffffu, many);
    if (repeated == 0) continue;
    int at = 0;
    if (lane == 0) at = atomicAdd(s.repeated, __popc(repeated));
    for (uint32_t left = repeated; left != 0; left &= left - 1) {
      const int l = __ffs(left) - 1;
      zero_floats(word_sums + static_cast<size_t>(__shfl_sync(0xffffffffu, row, l)) * C, C, lane, kWarpSize);
    }
    at = __shfl_sync(0xffffffffu, at, 0) + __popc(repeated & ((1u << lane) - 1));
    if (many && at < lookup.vocab) s.pairs[at] = make_int2(word, row);
  }
  // Whole float4s: the position and type rows are C floats each.
  zero_float4s(small_sums, small_float4s, block * blockDim.x + threadIdx.x, blocks * blockDim.x);
}

// G row groups of TPR threads, one vector a thread, over a run of `per_block` consecutive entries
// (so that the tokens of a position are mostly in one block's run); group g takes entries g, g + G,
// ... of the run, loading each a token ahead. For each token: the LayerNorm backward, then de of a
// word used once goes straight to its row of dword (rounded once, from float), de of a word used
// more than once is added with float atomics into the float row that sums it, and the de of a
// group's consecutive tokens of one position are summed in registers and added to the position's
// float row once per run. The dgamma/dbeta and token-type sums of each column stay in shared
// memory, per group (the column's owner thread adds to them); at the end the block writes its
// dgamma/dbeta partial row and adds its type sums with atomics. Several groups a block make the
// blocks, and so these per-block costs, fewer (H100, 8192 x 768 fp16, the kernel alone: one group
// a block took 58 us with 660 blocks and 75 us with 1024; four groups take 60.5 us, and the whole
// backward 80.7 against 90.5 us at best with one). Last, the block zeroes the rows of dword, among
// its share of the vocabulary, that no token uses. The shared sums are laid out so that a warp's
// float4 accesses hit consecutive words: with column c at c (8 threads of a warp on a bank) the
// kernel was bound by L1 at 84% (ncu, 73 us) and the backward took 80.8 us; now 51 us under ncu and
// the backward 61.8 us (16384 x 1024: 167.8 -> 108.0 us). Registers are capped at 64 for 1024
// threads an SM.
template <class T, int VEC, int TPR, int G>
__global__ void __launch_bounds__(TPR* G, 1024 / (TPR * G))
    embedding_layernorm_backward_sorted_kernel(const BackwardArgs<T> a, const SortedTokens s, T* __restrict__ dword,
                                               int per_block) {
  wait_for_prior_grid();                   // the entries: launch_after_prior
  constexpr int kWarps = TPR / kWarpSize;  // a group's
  __shared__ float scratch[G][2][kWarps];
  __shared__ int unused[TPR * G];
  extern __shared__ float dynamic_shared[];  // [G][2][C] dgamma, dbeta sums; then [G][types][C] type sums
  using V = Vec<T, VEC>;
  const int C = a.C, group = threadIdx.x / TPR, t = threadIdx.x % TPR, c = t * VEC;
  const int lane = threadIdx.x % kWarpSize, warp = t / kWarpSize;
  const bool active = c < C;
  const Lookup& lookup = a.lookup;
  const bool shared_types = a.type_sums_offset >= 0;
  float* column_sums = dynamic_shared + static_cast<size_t>(group) * 2 * C;
  float* type_sums = dynamic_shared + a.type_sums_offset + static_cast<size_t>(group) * lookup.types * C;
  // The shared sums hold columns t * VEC + 4q.. as the float4 number q * vectors + t, so a warp's
  // threads read and write consecutive float4s (the plain layout put 8 threads of a warp on a bank).
  static_assert(VEC % 4 == 0, "16-byte vectors of 16- or 32-bit types");
  const int vectors = C / VEC;
  auto add_sums = [&](float* sums, const float* v) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      float4* at = reinterpret_cast<float4*>(sums) + q * vectors + t;
      float4 s = *at;
      s.x += v[4 * q];
      s.y += v[4 * q + 1];
      s.z += v[4 * q + 2];
      s.w += v[4 * q + 3];
      *at = s;
    }
  };
  const int shared_floats = G * C * (2 + (shared_types ? lookup.types : 0));
  for (int i = threadIdx.x; i < shared_floats; i += blockDim.x) dynamic_shared[i] = 0.f;
  __syncthreads();
  float position_sum[VEC];
  int position = -1;  // of position_sum
  auto flush_position = [&] {
    if (position >= 0 && active) add_floats<VEC>(a.small_sums + static_cast<size_t>(position) * C + c, position_sum);
  };

  const int begin = blockIdx.x * per_block, end = min(begin + per_block, a.rows);
  int4 next = begin + group < end ? s.entries[begin + group] : make_int4(0, -1, 0, 0);
  int next_row = begin + group < end ? s.entry_rows[begin + group] : -1;
  for (int first = begin; first < end; first += G) {
    const int i = first + group;
    const int4 e = next;  // (token, word, position, type); word -1: no token, or ids out of range
    const int word_row = next_row;
    if (i + G < end) {
      next = s.entries[i + G];
      next_row = s.entry_rows[i + G];
    } else {
      next = make_int4(0, -1, 0, 0);
    }
    const bool token = i < end && e.y >= 0;
    const bool work = token && active;
    const size_t base = static_cast<size_t>(e.x) * C;
    V w, p, ty, dyv, gv;
    uint32_t kept = 0;
    float mu = 0.f, rs = 0.f;
    if (work) {
      w = V::load(a.tables.word + static_cast<size_t>(e.y) * C + c);
      p = V::load(a.tables.position + static_cast<size_t>(e.z) * C + c);
      ty = V::load(a.tables.type + static_cast<size_t>(e.w) * C + c);
      dyv = V::load_stream(a.dy + base + c);
      gv = V::load(a.gamma + c);
      kept = a.dropout.template kept_bits<VEC>(base + c);
      mu = a.mean[e.x];
      rs = a.rstd[e.x];
    }
    float xhat[VEC], g[VEC];
    float sum_g = 0.f, sum_gx = 0.f;
    if (work) {
      float dx[VEC], dv[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float x = embedding_sum(to_float(w.v[k]), to_float(p.v[k]), to_float(ty.v[k]));
        const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept, k));
        xhat[k] = (x - mu) * rs;
        // Rounded products, as the unsorted kernel (no FMA contraction).
        g[k] = __fmul_rn(d, to_float(gv.v[k]));
        sum_g += g[k];
        sum_gx += g[k] * xhat[k];
        dx[k] = d * xhat[k];
        dv[k] = d;
      }
      add_sums(column_sums, dx);  // c's owner thread in this group
      add_sums(column_sums + C, dv);
    }
    // The group's two sums: shuffles within each warp, then the group's warps in shared memory.
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    __syncthreads();  // scratch may still be read by the last token's groups
    if (lane == 0) {
      scratch[group][0][warp] = sum_g;
      scratch[group][1][warp] = sum_gx;
    }
    __syncthreads();
    sum_g = sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) {
      sum_g += scratch[group][0][k];
      sum_gx += scratch[group][1][k];
    }
    if (!work) continue;  // past the block's barriers for this token
    const float mean_g = sum_g / C, mean_gx = sum_gx / C;
    float de[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) de[k] = rs * (g[k] - mean_g - xhat[k] * mean_gx);
    if (word_row < 0) {
      V out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(de[k]);
      out.store(dword + static_cast<size_t>(e.y) * C + c);
    } else {
      add_floats<VEC>(a.word_sums + static_cast<size_t>(word_row) * C + c, de);
    }
    if (e.z != position) {
      flush_position();
      position = e.z;
#pragma unroll
      for (int k = 0; k < VEC; ++k) position_sum[k] = de[k];
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) position_sum[k] += de[k];
    }
    if (shared_types) {
      add_sums(type_sums + e.w * C, de);  // c's owner thread in this group
    } else {
      add_floats<VEC>(a.small_sums + (static_cast<size_t>(lookup.positions) + e.w) * C + c, de);
    }
  }
  flush_position();
  __syncthreads();
  float* block_partial = a.partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  // The shared index of entry i of [rows][C]: row i / C, column i % C at its place in the row.
  auto placed = [&](int i) {
    const int row = i / C, column = i - row * C, k = column % VEC;
    return row * C + ((k / 4) * vectors + column / VEC) * 4 + k % 4;
  };
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    const int from = placed(i);
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < G; ++q) sum += dynamic_shared[q * 2 * C + from];
    block_partial[i] = sum;
  }
  if (shared_types) {
    const float* types_of = dynamic_shared + a.type_sums_offset;
    float* to = a.small_sums + static_cast<size_t>(lookup.positions) * C;
    for (int i = threadIdx.x; i < lookup.types * C; i += blockDim.x) {
      const int from = placed(i);
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < G; ++q) sum += types_of[q * lookup.types * C + from];
      if (sum != 0.f) atomicAdd(to + i, sum);
    }
  }
  // The block's share of the vocabulary: rows no token uses are zero. The counts of TPR x G rows are
  // loaded at once (one a thread), then each group writes every G-th of the rows.
  const int words = ceil_div(lookup.vocab, static_cast<int>(gridDim.x));
  const int first_word = blockIdx.x * words, last_word = min(first_word + words, lookup.vocab);
  V zero;
#pragma unroll
  for (int k = 0; k < VEC; ++k) zero.v[k] = from_float<T>(0.f);
  for (int first = first_word; first < last_word; first += TPR * G) {
    __syncthreads();  // unused[] of the last pass is read
    unused[threadIdx.x] = first + static_cast<int>(threadIdx.x) < last_word && s.count[first + threadIdx.x] == 0;
    __syncthreads();
    const int n = min(TPR * G, last_word - first);
    for (int j = group; j < n; j += G) {
      if (unused[j] && active) zero.store(dword + static_cast<size_t>(first + j) * C + c);
    }
  }
}

// The sorted backward's row kernel for rows of W x NV x 32 16-byte vectors compiled in (BERT's 768
// and 1024 columns in 16-bit types: W = 3 and 4 warps, NV = 1 vector a lane). A group of W warps
// takes a run of `per_group` consecutive entries (the tokens of a position are mostly in one run);
// lane l of the group's warp u holds vectors (u NV + j) 32 + l. For each token: the LayerNorm
// backward, whose two row sums are shuffles within each warp, then meet in shared memory at the
// group's own named barrier (one a token: the slot alternates); de of a word used once goes
// straight to its row of dword (rounded once, from float), de of a word used more than once is
// added with float atomics into the float row that sums it, and the de of consecutive tokens of one
// position are summed in registers and added to the position's float row once per run. Each group
// keeps its own dgamma, dbeta (and, where kTypeSumsInShared allows, token-type) sums in shared
// memory, each column's floats touched only by the lane that owns the column, so they need neither
// atomics nor barriers. At the end the block adds its groups' sums into its dgamma/dbeta partial row
// and its type sums (atomics). Each warp also zeroes the rows of dword, among its share of the
// vocabulary, that no token uses (after its tokens: H100, fp16, 8192 x 768, the backward took 61.4
// us so against 63.4 with the zeros written first).
//
// It is bound by memory latency, so what counts is the warps in flight. With a warp a token (the
// whole row in a lane's registers, 3 or 4 vectors) it took 127 registers and ran 16 warps an SM
// (ncu, fp16, 8192 x 768, p = 0.1: 21.8% achieved occupancy, no eligible warp in 60% of cycles, long
// scoreboard the top stall, DRAM 43% and L2 65% busy; without dropout, no Philox, the same time).
// A vector a lane takes 79 registers at 768 columns (2 blocks of 12 warps an SM) and 64 at 1024 (2
// of 16). H100, fp16, A/B in one process, "row kernel" its CUPTI time a call, medians of the
// forward + backward:
//   8192 x 768   row kernel 36.6-37.5 -> 31.2-31.6 us, forward + backward 70.0-70.1 -> 64.1-64.4 us
//   16384 x 768  54.3 -> 47.6 us, 103.3 -> 96.8 us
//   8192 x 1024  43.9-44.5 -> 41.9-42.3 us, 84.6-85.5 -> 80.6-80.9 us
//   16384 x 1024 72.9 -> 65.7 us, 132.7 -> 127.1 us
// Three blocks an SM at 768 columns (56 registers, 24 bytes spilled) took 36.8 us, no better than a
// warp a token. The block kernel above (row groups with block-wide barriers, a quarter of its
// threads idle at 768 columns) took 39.1 us. Tried and dropped with a warp a token (A/B as above):
// - loading the next token's rows while one is computed (two tokens' reads in flight a warp, at 12
//   warps an SM): nothing gained at 768 columns (the backward 57.9 against 58.4 us), 9 us lost at
//   1024;
// - the sort in this kernel, launched cooperatively, its steps parted by grid.sync() instead of the
//   memset and the two kernels: at 8192 x 768 the row kernel took 48.6 us against 37.2 + 4.4
//   (counts) + 3.6 (order), and forward + backward 70.8 against 69.6 us; 16384 x 1024 130.2
//   against 132.6 us. Three grid-wide barriers cost about what the launches they replace do;
// - one warp a block zeroing the unused rows while three take the tokens: the row kernel 43.1
//   against 37.2 us (16384 x 1024: 83.5 against 73.7); a quarter fewer token warps cost more than
//   the zeroing, which L2 mostly absorbs, saves;
// - asking L2 for the rows of the tokens 4 ahead (prefetch.global.L2, a lane a 128-byte line):
//   40.5 against 37.3 us (16384 x 1024: 85.0 against 71.4).
// Tried and dropped with the split (forward + backward, A/B in one process):
// - copying the word rows, dy, mean and rstd of the next token (or two) into shared memory with
//   cp.async while one computes: 8192 x 768 65.1 against 59.4 us, 16384 x 1024 130 against 122;
// - the unused rows zeroed before the wait (the ordering kernel letting this one start early):
//   63.2 against 61.0 us; or by a second kernel beside this one (this one letting it start after
//   its wait, the zeroing kernel waiting for it only at its end): 69.5 to 80 against 61 us, this
//   kernel slowed from 31 to 34.5-43 us by the zeros' traffic. Without the zeroing at all (timing
//   only) the kernel takes 22 us: the zeros cost their bytes at about the copy bandwidth.
constexpr int kTokenGroups = 4;       // a block's
constexpr int kTypeSumsInShared = 4;  // token types summed in shared memory (else float atomics)
constexpr int kSplitMinBlocks = 2;    // an SM: registers for 24 warps at 768 columns, 32 at 1024

template <class T, int NV, int W>
__global__ void __launch_bounds__(kTokenGroups* W* kWarpSize, kSplitMinBlocks)
    embedding_layernorm_backward_split_kernel(const BackwardArgs<T> a, const SortedTokens s, T* __restrict__ dword,
                                              int per_group) {
  constexpr int VEC = 16 / sizeof(T), C = W * NV * kWarpSize * VEC, Q = VEC / 4;  // float4s a vector
  static_assert(sizeof(T) == 2, "16-bit types: 8 elements a 16-byte vector");
  using V = Vec<T, VEC>;
  extern __shared__ float4 warp_sums[];  // per warp: [kinds][NV][Q][32] float4s; kinds: dgamma, dbeta, types
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int group = warp / W, wg = warp % W;  // the token-row group, the warp's place in it
  const Lookup& lookup = a.lookup;
  const bool shared_types = a.type_sums_offset >= 0;
  const int kinds = 2 + (shared_types ? lookup.types : 0);
  // A group's sums: [kinds][W][NV][Q][32] float4s.
  float4* mine = warp_sums + static_cast<size_t>(group) * kinds * (C / 4) + wg * NV * Q * kWarpSize;
  // Lane l's float4 q of vector j in sums of kind `kind`: consecutive lanes on consecutive float4s.
  auto at = [&](int kind, int j, int q) { return mine + (kind * W * NV * Q + j * Q + q) * kWarpSize + lane; };
  // Column of the lane's vector j.
  auto col = [&](int j) { return ((wg * NV + j) * kWarpSize + lane) * VEC; };
  __shared__ float2 row_sums[kTokenGroups][2][W];
  auto add_to = [&](int kind, const float(&v)[NV][VEC]) {
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        float4* p = at(kind, j, q);
        float4 s4 = *p;
        s4.x += v[j][4 * q];
        s4.y += v[j][4 * q + 1];
        s4.z += v[j][4 * q + 2];
        s4.w += v[j][4 * q + 3];
        *p = s4;
      }
    }
  };
  // Before the wait (nothing here depends on the kernels before): the warp's sums zeroed.
  for (int kind = 0; kind < kinds; ++kind)
    for (int i = lane; i < NV * Q * kWarpSize; i += kWarpSize)
      mine[kind * W * NV * Q * kWarpSize + i] = make_float4(0.f, 0.f, 0.f, 0.f);
  wait_for_prior_grid();  // the entries: launch_after_prior

  float position_sum[NV][VEC];
  int position = -1;  // of position_sum
  auto flush_position = [&] {
    if (position < 0) return;
#pragma unroll
    for (int j = 0; j < NV; ++j)
      add_floats<VEC>(a.small_sums + static_cast<size_t>(position) * C + col(j), position_sum[j]);
  };
  const int run = blockIdx.x * kTokenGroups + group;
  // The group's named barrier (the CTA-wide one is 0).
  auto group_barrier = [&] { asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "r"(W * kWarpSize) : "memory"); };
  int parity = 0;
  const int begin = min(run * per_group, a.rows), end = min(begin + per_group, a.rows);
  int4 next = begin < end ? s.entries[begin] : make_int4(0, -1, 0, 0);
  int next_row = begin < end ? s.entry_rows[begin] : -1;
  for (int i = begin; i < end; ++i) {
    const int4 e = next;  // (token, word, position, type); word -1: ids out of range
    const int word_row = next_row;
    if (i + 1 < end) {
      next = s.entries[i + 1];
      next_row = s.entry_rows[i + 1];
    }
    if (e.y < 0) {      // the whole group: e is the same in every lane
      group_barrier();  // one a token, skipped or not (below)
      continue;
    }
    const size_t base = static_cast<size_t>(e.x) * C;
    V w[NV], p[NV], ty[NV], dyv[NV];
    uint32_t kept[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = col(j);
      // The word rows evict first, as dy: read once here (a few times for a repeated word), they
      // would otherwise push out of L2 the float sums of the repeated words that the tables kernel
      // reads next (H100, fp16, forward + backward, A/B in one call: 16384 x 768 87.8-88.1 ->
      // 86.2-86.7 us, 8192 x 768 55.4-55.7 -> 55.0 us). Asking L2 to keep those sums (an
      // evict-last policy on their zeroing and their atomics) was slower: 88.0-88.4 and 56.1-56.3.
      w[j] = V::load_stream(a.tables.word + static_cast<size_t>(e.y) * C + c);
      p[j] = V::load(a.tables.position + static_cast<size_t>(e.z) * C + c);
      ty[j] = V::load(a.tables.type + static_cast<size_t>(e.w) * C + c);
      dyv[j] = V::load_stream(a.dy + base + c);
    }
#pragma unroll
    for (int j = 0; j < NV; ++j) kept[j] = a.dropout.template kept_bits<VEC>(base + col(j));
    const float mu = a.mean[e.x], rs = a.rstd[e.x];
    float xhat[NV][VEC], g[NV][VEC], tmp[NV][VEC];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const V gv = V::load(a.gamma + col(j));  // from L1 after the first token
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float x = embedding_sum(to_float(w[j].v[k]), to_float(p[j].v[k]), to_float(ty[j].v[k]));
        const float d = __fmul_rn(to_float(dyv[j].v[k]), a.dropout.multiplier(kept[j], k));
        xhat[j][k] = (x - mu) * rs;
        // Rounded products, as the other backward kernels (no FMA contraction).
        g[j][k] = __fmul_rn(d, to_float(gv.v[k]));
        sum_g += g[j][k];
        sum_gx += g[j][k] * xhat[j][k];
        tmp[j][k] = d;
      }
    }
    add_to(1, tmp);  // dbeta: d
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) tmp[j][k] *= xhat[j][k];
    }
    add_to(0, tmp);  // dgamma: d * xhat
                     // The warp's two sums, their shuffles interleaved.
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      sum_g += __shfl_xor_sync(0xffffffffu, sum_g, offset);
      sum_gx += __shfl_xor_sync(0xffffffffu, sum_gx, offset);
    }
    // The group's warps' sums, in a slot that alternates by token: one barrier a token.
    if (lane == 0) row_sums[group][parity][wg] = make_float2(sum_g, sum_gx);
    group_barrier();
    sum_g = sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float2 v = row_sums[group][parity][k];
      sum_g += v.x;
      sum_gx += v.y;
    }
    parity ^= 1;
    const float mean_g = sum_g / C, mean_gx = sum_gx / C;
    float de[NV][VEC];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) de[j][k] = rs * (g[j][k] - mean_g - xhat[j][k] * mean_gx);
    }
#pragma unroll
    // dword rows of words used once with streaming stores, as the zeros below (H100, fp16, forward +
    // backward, A/B in one call: 16384 x 768 88.0-88.2 -> 86.6-86.9 us, this kernel 47.8 -> 46.6 us).
    for (int j = 0; j < NV; ++j) {
      const int c = col(j);
      if (word_row < 0) {
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(de[j][k]);
        out.store_stream(dword + static_cast<size_t>(e.y) * C + c);
      } else {
        add_floats<VEC>(a.word_sums + static_cast<size_t>(word_row) * C + c, de[j]);
      }
    }
    if (e.z != position) {
      flush_position();
      position = e.z;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) position_sum[j][k] = de[j][k];
      }
    } else {
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) position_sum[j][k] += de[j][k];
      }
    }
    if (shared_types) {
      add_to(2 + e.w, de);
    } else {
#pragma unroll
      for (int j = 0; j < NV; ++j)
        add_floats<VEC>(a.small_sums + (static_cast<size_t>(lookup.positions) + e.w) * C + col(j), de[j]);
    }
  }
  flush_position();
  // A group that held fewer than per_group entries (the tail of the entries) takes its remaining
  // named barriers here, so that every thread of the block has taken per_group of them before
  // __syncthreads(). Nothing needs them: __syncthreads() orders the groups' sums before the reads
  // below. But compute-sanitizer racecheck, where threads of a block have taken different numbers
  // of barriers, reports the sums' stores and those reads as hazards (seen with 1 token, three
  // groups of four empty; tests/gpu/racecheck_named_barrier_probe.cu shows it on a small kernel),
  // and with the counts equal it can check this kernel.
  for (int k = end - begin; k < per_group; ++k) group_barrier();
  __syncthreads();
  // The block's groups' sums, column by column: column c of kind `kind` in group w's sums.
  const float* sums = reinterpret_cast<const float*>(warp_sums);
  auto placed = [&](int w, int kind, int column) {   // w: the group
    const int v = column / VEC, k = column % VEC;    // vector v = (wg * NV + j) * 32 + l
    const int u = v / kWarpSize, l = v % kWarpSize;  // u = wg * NV + j
    return (((static_cast<size_t>(w) * kinds + kind) * W * NV * Q + u * Q + k / 4) * kWarpSize + l) * 4 + k % 4;
  };
  float* block_partial = a.partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kTokenGroups; ++w) sum += sums[placed(w, i / C, i % C)];
    block_partial[i] = sum;
  }
  if (shared_types) {
    float* to = a.small_sums + static_cast<size_t>(lookup.positions) * C;
    for (int i = threadIdx.x; i < lookup.types * C; i += blockDim.x) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kTokenGroups; ++w) sum += sums[placed(w, 2 + i / C, i % C)];
      if (sum != 0.f) atomicAdd(to + i, sum);
    }
  }
  // The warp's share of the vocabulary: its rows that no token uses are zero. The warp looks at 32
  // rows' counts at once, then writes the unused ones, whole rows, with streaming stores: nothing
  // reads them here, and in L2 they would evict the float sums that sorted_gradients_kernel reads
  // next (H100, fp16, A/B in one process: forward + backward 8192 x 768 60.8-61.0 -> 59.4-59.5 us,
  // that kernel 5.8 -> 4.9 us; 8192 x 1024 77.1-77.2 -> 75.9 us). (Writing a few of them with each
  // token, while the token's loads fly, was slower with a warp a token: H100, fp16, 8192 x 768, the
  // backward 61.6 against 59.3 us.)
  const int words = ceil_div(lookup.vocab, static_cast<int>(gridDim.x) * kTokenGroups * W);
  const int first_word = min((blockIdx.x * kTokenGroups * W + warp) * words, lookup.vocab),
            last_word = min(first_word + words, lookup.vocab);
  V zero;
#pragma unroll
  for (int k = 0; k < VEC; ++k) zero.v[k] = from_float<T>(0.f);
  for (int first = first_word; first < last_word; first += kWarpSize) {
    const int word = first + lane;
    uint32_t unused = __ballot_sync(0xffffffffu, word < last_word && s.count[word] == 0);
    while (unused != 0) {
      const int r = __ffs(unused) - 1;
      unused &= unused - 1;
#pragma unroll
      for (int j = 0; j < W * NV; ++j)
        zero.store_stream(dword + static_cast<size_t>(first + r) * C + (j * kWarpSize + lane) * VEC);
    }
  }
}

// The rows of the tables after the sorted backward: slot y (of `slots`) converts rows
// kRowsAtOnce * y + i, i < kRowsAtOnce, then the same rows kRowsAtOnce * slots further on, ..., x of
// `threads` threads on each row; a thread's loads of all its rows are issued before their stores.
// Rows of whole float4s are read as float4s, the last use of the sums. H100, fp16, forward +
// backward, A/B in one call: scalar loads against float4s, a row a slot, 8192 x 768 56.6-56.8 ->
// 56.2 us (this kernel 4.8 -> 4.5-4.6 us); two rows a slot against one (in a build where one row a
// slot took 11.7 us at 16384 x 768, against 8.0-8.1 in the build before), 16384 x 768 88.2-88.8 ->
// 85.4-85.8 us, 8192 x 768 56.2-56.6 -> 54.7-54.8 us, 16384 x 1024 118.4 -> 114.7 us.
constexpr int kRowsAtOnce = 2;

template <class T, int VEC>
__device__ __forceinline__ void sorted_table_rows(const SortedTokens& s, const float* __restrict__ word_sums,
                                                  const float* __restrict__ small_sums, T* __restrict__ dword,
                                                  T* __restrict__ dposition, T* __restrict__ dtype, int positions,
                                                  int types, int C, int vocab, int x, int threads, int y, int slots) {
  // At most vocab places of the list: after a backward on the same counts the counter holds more.
  const int repeated = min(*s.repeated, vocab), total = repeated + positions + types;
  // Row `row`'s float sums and the gradient row they become.
  auto place = [&](int row, const float*& from, T*& to) {
    if (row < repeated) {
      const int2 pair = s.pairs[row];  // (word, the row of word_sums that sums it)
      from = word_sums + static_cast<size_t>(pair.y) * C;
      to = dword + static_cast<size_t>(pair.x) * C;
    } else {
      const int small = row - repeated;
      from = small_sums + static_cast<size_t>(small) * C;
      to = small < positions ? dposition + static_cast<size_t>(small) * C
                             : dtype + static_cast<size_t>(small - positions) * C;
    }
  };
  constexpr int R = kRowsAtOnce;
  constexpr bool kFloat4Vectors = VEC % 4 == 0;
  const bool float4s = kFloat4Vectors && C % 4 == 0;
  for (int first = R * y; first < total; first += R * slots) {
    const float* from[R];
    T* to[R];
    const int rows = min(R, total - first);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i < rows) place(first + i, from[i], to[i]);
    }
    for (int c = x * VEC; c < C; c += threads * VEC) {
      float v[R][VEC];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i >= rows) continue;
        if constexpr (kFloat4Vectors) {
          if (float4s) {
#pragma unroll
            for (int q = 0; q < VEC / 4; ++q) {
              const float4 f = __ldcs(reinterpret_cast<const float4*>(from[i] + c) + q);
              v[i][4 * q] = f.x;
              v[i][4 * q + 1] = f.y;
              v[i][4 * q + 2] = f.z;
              v[i][4 * q + 3] = f.w;
            }
            continue;
          }
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[i][k] = from[i][c + k];
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i >= rows) continue;
        Vec<T, VEC> out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[i][k]);
        out.store(to[i] + c);
      }
    }
  }
}

// After the sorted backward, in one launch: the rows of dword of words used more than once, and every
// row of dposition and dtoken_type, from their float sums; and dgamma, dbeta from the row kernel's
// partial rows. Blocks [0, C / kGradientColumns) each sum a tile of columns (parameter_gradient_
// kernel's work), the others convert rows, `row_threads` threads a row (H100, fp16, 8192 x 768: the
// two as separate kernels took 5.2 and 4.0 us a call, one launch 5.5 to 6.4 us in three runs).
template <class T, int VEC>
__global__ void __launch_bounds__(kGradientThreads)
    sorted_gradients_kernel(const SortedTokens s, const float* __restrict__ word_sums,
                            const float* __restrict__ small_sums, T* __restrict__ dword, T* __restrict__ dposition,
                            T* __restrict__ dtype, int positions, int types, int C, const float* __restrict__ partial,
                            int parts, ParameterGradients<T, 2> parameters, int row_threads, int vocab) {
  wait_for_prior_grid();  // the sums and the partial rows: launch_after_prior
  const int tiles = ceil_div(C, kGradientColumns);
  if (static_cast<int>(blockIdx.x) < tiles) {
    parameter_gradient_tile<T, 2>(partial, parts, C, parameters, blockIdx.x);
    return;
  }
  const int rows_per_block = kGradientThreads / row_threads, y = threadIdx.x / row_threads;
  if (y >= rows_per_block) return;
  sorted_table_rows<T, VEC>(s, word_sums, small_sums, dword, dposition, dtype, positions, types, C, vocab,
                            threadIdx.x % row_threads, row_threads, (blockIdx.x - tiles) * rows_per_block + y,
                            (gridDim.x - tiles) * rows_per_block);
}

template <class T>
struct TableGradientArgs {
  const int* mark;
  const int* slot;
  const float* word_sums;
  const float* small_sums;
  T* dword;
  T* dposition;
  T* dtype;
  int vocab;
  int positions;
  int types;
  int C;
};

// Writes every row of the three gradient tables once: rows of word ids not in use are zero. Thread
// (x, y) of a block: columns x * VEC.. of row y of the block's rows.
template <class T, int VEC>
__global__ void table_gradient_kernel(const TableGradientArgs<T> a) {
  wait_for_prior_grid();  // the sums: launch_after_prior
  const int total = a.vocab + a.positions + a.types, C = a.C;
  for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < total; row += gridDim.x * blockDim.y) {
    const float* from;
    T* to;
    if (row < a.vocab) {
      from = a.mark[row] ? a.word_sums + static_cast<size_t>(a.slot[row]) * C : nullptr;
      to = a.dword + static_cast<size_t>(row) * C;
    } else {
      from = a.small_sums + static_cast<size_t>(row - a.vocab) * C;
      to = row < a.vocab + a.positions ? a.dposition + static_cast<size_t>(row - a.vocab) * C
                                       : a.dtype + static_cast<size_t>(row - a.vocab - a.positions) * C;
    }
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      float v[VEC];
      if (from == nullptr) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = 0.f;
      } else if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q) {
          const float4 f = __ldcs(reinterpret_cast<const float4*>(from + c) + q);
          v[4 * q] = f.x;
          v[4 * q + 1] = f.y;
          v[4 * q + 2] = f.z;
          v[4 * q + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = from[c + k];
      }
      Vec<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[k]);
      out.store(to + c);
    }
  }
}

// ---- kernel launchers

// The backward holds three floats per element (e and two accumulators) and the dy vectors: longer
// rows than 256 threads x 4 vectors take the looping kernel.
constexpr int kBackwardMaxThreadsPerRow = 256;
// Token-type sums go through shared memory where they fit in this much of it.
constexpr size_t kTypeSumsSharedBytes = 32 * 1024;

int backward_block_limit(int rows) {
  const int sms = multiprocessors();
  return std::max(1, std::min(rows, std::max(sms, std::min(rows / 8, 16 * sms))));
}

// The backward's workspace, in floats, each part a whole number of 16-byte units. The sorted
// backward zeroes count .. small_sums (the counters) with one kernel and small_sums in its ordering
// kernel, the unsorted one small_sums .. counter with a memset.
struct WorkspaceLayout {
  size_t partial, count, pcount, repeated, small_sums, word_sums, mark, counter, slot, second, rank, entries,
      entry_rows, pairs, total;
  explicit WorkspaceLayout(const EmbeddingLayerNormSizes& s) {
    auto round4 = [](size_t n) { return (n + 3) / 4 * 4; };
    const size_t C = s.hidden, tokens = static_cast<size_t>(s.tokens);
    partial = 0;
    count = partial + round4(2 * C * backward_block_limit(std::max(s.tokens, 1)));
    pcount = count + round4(s.vocab);
    repeated = pcount + round4(static_cast<size_t>(s.max_positions) + 1);
    small_sums = repeated + 4;
    word_sums = small_sums + round4((static_cast<size_t>(s.max_positions) + s.token_types) * C);
    // A row per distinct word (unsorted: slots) or per token (sorted: a token's row sums its word).
    mark = word_sums + round4(tokens * C);
    counter = mark + round4(s.vocab);  // one int, zeroed with the marks
    slot = counter + 4;
    second = slot + round4(s.vocab);
    rank = second + round4(s.vocab);
    entries = rank + round4(tokens);
    entry_rows = entries + 4 * tokens;
    pairs = entry_rows + round4(tokens);
    total = pairs + 2 * static_cast<size_t>(s.vocab);
  }
};

template <class T>
void forward_typed(const ForwardArgs<T>& a, cudaStream_t stream) {
  // Counting, the forward follows the kernel that zeroed the counters as its programmatic dependent.
  auto launch = [&](auto kernel, auto counting_kernel, int blocks, int threads) {
    if (a.count_ids)
      launch_after_prior(counting_kernel, dim3(blocks), dim3(threads), 0, stream, a);
    else
      kernel<<<blocks, threads, 0, stream>>>(a);
  };
  const int vec = vector_width<T>(a.C, {a.tables.word, a.tables.position, a.tables.type, a.gamma, a.beta, a.y});
  const Config config = choose_row_config(a.C / vec, 1024, vec);
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (kRowConfigBuilt<VEC, NV>) {
        // Lanes of a warp a row: 64-thread blocks, for finer residency.
        const int threads = TPR <= kWarpSize ? 64 : TPR;
        const int blocks = std::min(ceil_div(a.rows, threads / TPR), 256 * multiprocessors());
        if constexpr (TPR == kWarpSize && VEC * sizeof(T) == 16 && (NV == 3 || NV == 4)) {
          if (a.C == NV * TPR * VEC) {
            launch(embedding_layernorm_forward_kernel<T, VEC, NV, TPR, NV * TPR * VEC>,
                   embedding_layernorm_forward_kernel<T, VEC, NV, TPR, NV * TPR * VEC, true>, blocks, threads);
            return;
          }
        }
        launch(embedding_layernorm_forward_kernel<T, VEC, NV, TPR>,
               embedding_layernorm_forward_kernel<T, VEC, NV, TPR, 0, true>, blocks, threads);
      }
    });
    if (!done) {
      const int blocks = std::min(a.rows, 64 * multiprocessors());
      launch(embedding_layernorm_forward_looping_kernel<T>, embedding_layernorm_forward_looping_kernel<T>, blocks,
             1024);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

// The shape of the table-gradient kernels' launches over `rows` rows of C columns in vectors of VEC:
// blocks of (x, y) = (a warp-multiple of threads covering a row, up to 256 threads in all).
struct TableLaunch {
  dim3 block, grid;
  TableLaunch(int C, int vec, int rows) {
    const int x = std::min(256, ceil_div(ceil_div(C, vec), kWarpSize) * kWarpSize);
    block = dim3(x, std::max(1, 256 / x));
    grid = dim3(std::min(ceil_div(rows, static_cast<int>(block.y)), 32 * multiprocessors()));
  }
};

// The sorted backward's counts and order in the workspace.
SortedTokens sorted_tokens(float* base, const WorkspaceLayout& layout) {
  auto ints = [&](size_t at) { return reinterpret_cast<int*>(base + at); };
  return {ints(layout.count),
          ints(layout.pcount),
          ints(layout.second),
          ints(layout.rank),
          reinterpret_cast<int4*>(base + layout.entries),
          ints(layout.entry_rows),
          ints(layout.repeated),
          reinterpret_cast<int2*>(base + layout.pairs)};
}

// Zeroes the counters (count, pcount, repeated: count .. small_sums; the float sums are zeroed by the ordering
// kernel). A kernel, not a memset, so that the counting kernel (or the counting forward) launches as
// its programmatic dependent (H100, fp16, A/B in one process: forward + backward 8192 x 768
// 62.2-62.5 -> 60.6-60.8 us, 16384 x 1024 125.1 -> 123.5 us).
void zero_counters(float* base, const WorkspaceLayout& layout, cudaStream_t stream) {
  const int threads = 256, n = static_cast<int>((layout.small_sums - layout.count) / 4);  // whole float4s
  launch_after_prior(zero_float4s_kernel, dim3(std::clamp(ceil_div(n, threads), 1, 4 * multiprocessors())),
                     dim3(threads), 0, stream, reinterpret_cast<float4*>(base + layout.count), n);
}

// Position tables of up to this many rows take the sorted backward (every block of its ordering
// kernel scans the position counts in shared memory).
constexpr int kMaxSortedPositions = 8192;
// Row groups a block of the sorted backward (see its kernel). H100, fp16, the backward (all its
// kernels) at 8192 x 768: 85.6 us with 2, 80.7 with 4, 153.8 with 8; 16384 x 1024: 166.1, 167.0, 291.2.
// With the shared sums free of bank conflicts: 62.0 us with 2 against 61.8 with 4 (8192 x 768),
// 90.2 against 93.6 (16384 x 768), 73.6 against 70.9 (8192 x 1024), 110.2 against 108.0 (16384 x 1024).
constexpr int kSortedGroups = 4;

// The sorted backward, where it applies (rows of 33..256 16-byte vectors, and some tokens): returns
// false, having done nothing, where it does not.
template <class T>
bool backward_sorted(const BackwardArgs<T>& a, float* base, const WorkspaceLayout& layout, bool counted, T* dword,
                     T* dposition, T* dtype, T* dgamma, T* dbeta, cudaStream_t stream) {
  const Lookup& l = a.lookup;
  const int vec = vector_width<T>(a.C, {a.dy, a.tables.word, a.tables.position, a.tables.type, a.gamma, dword});
  const Config config = vec > 1 ? block_row_config(a.C / vec) : Config{0, 0};
  if (a.rows == 0 || config.tpr == 0 || l.positions > kMaxSortedPositions) return false;
  const int threads = 256;
  const SortedTokens s = sorted_tokens(base, layout);
  if (!counted) {
    zero_counters(base, layout, stream);
    launch_after_prior(count_tokens_kernel, dim3(std::min(ceil_div(a.rows, 128), 16 * multiprocessors())), dim3(128), 0,
                       stream, l, a.rows, s);
  }
  // The scatter's blocks (a token a thread) and two blocks an SM sweeping the vocabulary.
  const int token_blocks = std::min(ceil_div(a.rows, threads), 4 * multiprocessors());
  launch_after_prior(order_tokens_kernel, dim3(token_blocks + 2 * multiprocessors()), dim3(threads),
                     sizeof(int) * (l.positions + 1), stream, l, a.rows, s, a.word_sums, a.C,
                     reinterpret_cast<float4*>(a.small_sums),
                     static_cast<int>((layout.word_sums - layout.small_sums) / 4), token_blocks);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  int blocks = 0;
  if constexpr (sizeof(T) == 2) {
    // Rows of 3 or 4 x 32 16-byte vectors: a group of 3 or 4 warps a token, a vector a lane.
    const int warps_a_row = vec == 8 && a.C % (kWarpSize * 8) == 0 ? a.C / (kWarpSize * 8) : 0;
    auto launch_split = [&](auto w_c) {
      constexpr int NV = 1, W = decltype(w_c)::value;
      auto kernel = embedding_layernorm_backward_split_kernel<T, NV, W>;
      BackwardArgs<T> args = a;
      const bool shared_types = l.types <= kTypeSumsInShared;
      args.type_sums_offset = shared_types ? 0 : -1;
      const size_t shared = sizeof(float) * kTokenGroups * (2 + (shared_types ? l.types : 0)) * a.C;
      // Past 48 KB with the static row_sums, the limit is raised.
      if (shared + sizeof(float2) * kTokenGroups * 2 * W > 48 * 1024) {
        FUSEKIT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
      }
      // One wave of groups, each on a run of consecutive entries; at most backward_block_limit
      // blocks (the dgamma/dbeta partial rows).
      const int threads = kTokenGroups * W * kWarpSize;
      int resident = 0;
      FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared));
      const int groups =
          kTokenGroups * std::max(1, std::min(backward_block_limit(a.rows), std::max(resident, 1) * multiprocessors()));
      const int per_group = ceil_div(a.rows, groups);
      blocks = ceil_div(ceil_div(a.rows, per_group), kTokenGroups);
      launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, args, s, dword, per_group);
    };
    if (warps_a_row == 3) launch_split(std::integral_constant<int, 3>{});
    if (warps_a_row == 4) launch_split(std::integral_constant<int, 4>{});
  }
  if (blocks == 0)
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      if constexpr (VEC > 1) {
        dispatch_block_row_config(config, [&](auto tpr_c, auto) {
          constexpr int TPR = decltype(tpr_c)::value;
          constexpr int G = std::min(kSortedGroups, 1024 / TPR);
          auto kernel = embedding_layernorm_backward_sorted_kernel<T, VEC, TPR, G>;
          BackwardArgs<T> args = a;
          const size_t column_bytes = sizeof(float) * G * 2 * a.C;
          const size_t type_bytes = sizeof(float) * G * static_cast<size_t>(l.types) * a.C;
          args.type_sums_offset = type_bytes <= kTypeSumsSharedBytes ? G * 2 * a.C : -1;
          const size_t shared = column_bytes + (args.type_sums_offset >= 0 ? type_bytes : 0);
          const size_t static_bytes = sizeof(float) * G * 2 * (TPR / kWarpSize) + sizeof(int) * TPR * G;
          if (shared + static_bytes > 48 * 1024) {
            FUSEKIT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
          }
          // One wave, each block on a run of consecutive entries.
          int resident = 0;
          FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, TPR * G, shared));
          blocks = std::max(1, std::min({backward_block_limit(a.rows), std::max(resident, 1) * multiprocessors(),
                                         ceil_div(a.rows, G)}));
          const int per_block = ceil_div(a.rows, blocks);
          blocks = ceil_div(a.rows, per_block);
          launch_after_prior(kernel, dim3(blocks), dim3(TPR * G), shared, stream, args, s, dword, per_block);
        });
      }
    });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());

  const int table_vec = vector_width<T>(a.C, {dword, dposition, dtype});
  dispatch_vector_width<T>(table_vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    // At most one repeated word per two tokens.
    const int table_rows = std::min(a.rows / 2, l.vocab) + l.positions + l.types;
    const int row_threads = TableLaunch(a.C, VEC, table_rows).block.x;
    const int tiles = ceil_div(a.C, kGradientColumns);
    const int row_blocks =
        std::min(ceil_div(table_rows, kRowsAtOnce * (kGradientThreads / row_threads)), 32 * multiprocessors());
    launch_after_prior(sorted_gradients_kernel<T, VEC>, dim3(tiles + row_blocks), dim3(kGradientThreads), 0, stream, s,
                       a.word_sums, a.small_sums, dword, dposition, dtype, l.positions, l.types, a.C, a.partial, blocks,
                       ParameterGradients<T, 2>{{dgamma, dbeta}}, row_threads, l.vocab);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  return true;
}

template <class T>
void backward_typed(BackwardArgs<T> a, int* mark, int* slot_counter, int* slot, T* dword, T* dposition, T* dtype,
                    T* dgamma, T* dbeta, cudaStream_t stream) {
  const Lookup& l = a.lookup;
  int blocks = 0;  // partial rows written
  if (a.rows > 0) {
    const int threads = 256;
    mark_words_kernel<<<std::min(ceil_div(a.rows, threads), 16 * multiprocessors()), threads, 0, stream>>>(l, a.rows,
                                                                                                           mark);
    launch_after_prior(word_slots_kernel, dim3(std::min(ceil_div(l.vocab, threads), 4 * multiprocessors())),
                       dim3(threads), 0, stream, mark, slot, l.vocab, slot_counter);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());

    const int vec = vector_width<T>(a.C, {a.dy, a.tables.word, a.tables.position, a.tables.type, a.gamma});
    // Rows of 33..256 vectors (BERT's 768 and 1024 columns): a block per row, one vector a thread
    // (block_row_config), against a warp per row with its sums in shared memory and shared atomics
    // for the token types. H100, fp16, the backward (all its kernels): 8192 x 768 135.5 -> 113.9 us,
    // 16384 x 1024 276.4 -> 236.4 us; the suite's forward + backward 155.5 -> 133.0 us and
    // 322.9 -> 283.2 us.
    const Config block_config = vec > 1 ? block_row_config(a.C / vec) : Config{0, 0};
    const Config config =
        block_config.tpr > 0 ? block_config : choose_row_config(a.C / vec, kBackwardMaxThreadsPerRow, vec);
    const int limit = backward_block_limit(a.rows);
    blocks = limit;
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      auto launch = [&](auto tpr_c, auto nv_c) {
        constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
        if constexpr (TPR <= kBackwardMaxThreadsPerRow && kRowConfigBuilt<VEC, NV>) {
          const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
          const size_t warp_bytes = TPR <= kWarpSize ? sizeof(float) * 2 * a.C * (threads / kWarpSize) : 0;
          const size_t type_bytes = sizeof(float) * static_cast<size_t>(l.types) * a.C;
          BackwardArgs<T> args = a;
          args.type_sums_offset =
              type_bytes <= kTypeSumsSharedBytes ? static_cast<int>(warp_bytes / sizeof(float)) : -1;
          const size_t shared = warp_bytes + (args.type_sums_offset >= 0 ? type_bytes : 0);
          auto kernel = embedding_layernorm_backward_kernel<T, VEC, NV, TPR>;
          if (shared > 48 * 1024) {
            FUSEKIT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
          }
          // One wave (each block's partial row is written once, after all its rows), within the
          // limit the workspace was sized for.
          int resident = 0;
          FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared));
          blocks = std::max(
              1, std::min({limit, std::max(resident, 1) * multiprocessors(), ceil_div(a.rows, threads / TPR)}));
          launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, args);
        }
      };
      const bool done = dispatch_block_row_config(config, launch) || dispatch_config(config, launch);
      if (!done) {
        BackwardArgs<T> args = a;
        args.type_sums_offset = -1;
        embedding_layernorm_backward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(args);
      }
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  }

  const TableGradientArgs<T> tables{mark,  slot,    a.word_sums, a.small_sums, dword, dposition,
                                    dtype, l.vocab, l.positions, l.types,      a.C};
  const int vec = vector_width<T>(a.C, {dword, dposition, dtype});
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const TableLaunch launch(a.C, VEC, l.vocab + l.positions + l.types);
    launch_after_prior(table_gradient_kernel<T, VEC>, launch.grid, launch.block, 0, stream, tables);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  launch_parameter_gradients<T, 2>(a.partial, blocks, a.C, {{dgamma, dbeta}}, stream);
}

void check_sizes(const EmbeddingLayerNormSizes& s) {
  if (s.tokens < 0 || s.hidden <= 0 || s.vocab <= 0 || s.max_positions <= 0 || s.token_types <= 0) {
    throw std::invalid_argument(
        "embedding_layernorm: tokens must be >= 0 and hidden, vocab, max_positions, "
        "token_types > 0 (got tokens " +
        std::to_string(s.tokens) + ", hidden " + std::to_string(s.hidden) + ", vocab " + std::to_string(s.vocab) +
        ", max_positions " + std::to_string(s.max_positions) + ", token_types " + std::to_string(s.token_types) + ")");
  }
}

void check_dropout(Dropout dropout) {
  if (!(dropout.p >= 0.f && dropout.p < 1.f)) {
    throw std::invalid_argument("embedding_layernorm: dropout probability must be in [0, 1) (got " +
                                std::to_string(dropout.p) + ")");
  }
}

void require(bool present, const char* what) {
  if (!present) throw std::invalid_argument(std::string("embedding_layernorm: ") + what);
}

}  // namespace

void embedding_layernorm_forward(DType dtype, const EmbeddingLayerNormForwardTensors& tensors, Dropout dropout,
                                 EmbeddingLayerNormSizes sizes, float eps, cudaStream_t stream) {
  check_sizes(sizes);
  check_dropout(dropout);
  require(tensors.word_ids && tensors.position_ids && tensors.token_type_ids && tensors.word && tensors.position &&
              tensors.token_type && tensors.gamma && tensors.beta && tensors.y && tensors.mean && tensors.rstd,
          "forward needs the three id arrays, the three tables, gamma, beta, y, mean and rstd");
  if (sizes.tokens == 0) return;
  const Lookup lookup{tensors.word_ids, tensors.position_ids, tensors.token_type_ids,
                      sizes.vocab,      sizes.max_positions,  sizes.token_types};
  const bool count_ids = tensors.backward_workspace != nullptr;
  SortedTokens sort{};
  if (count_ids) {
    const WorkspaceLayout layout(sizes);
    float* base = static_cast<float*>(tensors.backward_workspace);
    sort = sorted_tokens(base, layout);
    zero_counters(base, layout, stream);
  }
  FUSEKIT_DTYPE_SWITCH(dtype, {
    const ForwardArgs<T> args{lookup,
                              {static_cast<const T*>(tensors.word), static_cast<const T*>(tensors.position),
                               static_cast<const T*>(tensors.token_type)},
                              static_cast<const T*>(tensors.gamma),
                              static_cast<const T*>(tensors.beta),
                              static_cast<T*>(tensors.y),
                              tensors.mean,
                              tensors.rstd,
                              sizes.tokens,
                              sizes.hidden,
                              eps,
                              dropout_stream(dropout.p, dropout.seed, dropout.offset),
                              sort,
                              count_ids};
    forward_typed<T>(args, stream);
  })
}

size_t embedding_layernorm_backward_workspace_bytes(EmbeddingLayerNormSizes sizes) {
  check_sizes(sizes);
  return sizeof(float) * WorkspaceLayout(sizes).total;
}

void embedding_layernorm_backward(DType dtype, const EmbeddingLayerNormBackwardTensors& tensors, Dropout dropout,
                                  EmbeddingLayerNormSizes sizes, void* workspace, cudaStream_t stream) {
  check_sizes(sizes);
  check_dropout(dropout);
  require(tensors.dy && tensors.word_ids && tensors.position_ids && tensors.token_type_ids && tensors.word &&
              tensors.position && tensors.token_type && tensors.gamma && tensors.mean && tensors.rstd &&
              tensors.dword && tensors.dposition && tensors.dtoken_type && tensors.dgamma && tensors.dbeta && workspace,
          "backward needs dy, the three id arrays, the three tables, gamma, mean, rstd, dword, dposition, "
          "dtoken_type, dgamma, dbeta and a workspace");
  const WorkspaceLayout layout(sizes);
  float* base = static_cast<float*>(workspace);
  const Lookup lookup{tensors.word_ids, tensors.position_ids, tensors.token_type_ids,
                      sizes.vocab,      sizes.max_positions,  sizes.token_types};
  int* mark = reinterpret_cast<int*>(base + layout.mark);
  int* slot = reinterpret_cast<int*>(base + layout.slot);
  FUSEKIT_DTYPE_SWITCH(dtype, {
    const BackwardArgs<T> args{lookup,
                               {static_cast<const T*>(tensors.word), static_cast<const T*>(tensors.position),
                                static_cast<const T*>(tensors.token_type)},
                               static_cast<const T*>(tensors.dy),
                               static_cast<const T*>(tensors.gamma),
                               tensors.mean,
                               tensors.rstd,
                               slot,
                               base + layout.word_sums,
                               base + layout.small_sums,
                               base + layout.partial,
                               sizes.tokens,
                               sizes.hidden,
                               -1,
                               dropout_stream(dropout.p, dropout.seed, dropout.offset)};
    T* const dword = static_cast<T*>(tensors.dword);
    T* const dposition = static_cast<T*>(tensors.dposition);
    T* const dtoken_type = static_cast<T*>(tensors.dtoken_type);
    T* const dgamma = static_cast<T*>(tensors.dgamma);
    T* const dbeta = static_cast<T*>(tensors.dbeta);
    if (!backward_sorted<T>(args, base, layout, tensors.ids_counted, dword, dposition, dtoken_type, dgamma, dbeta,
                            stream)) {
      // The accumulators and the marks are contiguous: one memset clears them.
      FUSEKIT_CUDA_CHECK(
          cudaMemsetAsync(base + layout.small_sums, 0, sizeof(float) * (layout.slot - layout.small_sums), stream));
      backward_typed<T>(args, mark, reinterpret_cast<int*>(base + layout.counter), slot, dword, dposition, dtoken_type,
                        dgamma, dbeta, stream);
    }
  })
}

}  // namespace fusekit::kernels
