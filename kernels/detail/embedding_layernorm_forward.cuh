// Embedding + LayerNorm forward: the register row kernel (row groups of TPR threads, the row length
// compiled in for BERT's 768 and 1024 columns) and the looping kernel for longer rows, a block a row.
// Both gather e = word + position + type straight from the tables into registers.
#pragma once

#include "kernels/detail/embedding_layernorm_common.cuh"

namespace fusekit::kernels {
// Included by embedding_layernorm.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

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
  // draws in place without extracting them (both below); with four (1024 columns) the in-place
  // compares cost registers (110 against 77) and drawing first measured slower.
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
      // addresses wait for them). Drawn after the table loads, as the other configurations do, the
      // compiler scheduled part of e's sums (which wait for the rows) ahead of Philox, and the warp
      // stalled before it.
      auto draw = [&] {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
          drawn[j] = dropout.dropping
                         ? dropout_words(dropout.seed, dropout.offset_now(), (base + (j * TPR + t) * VEC) >> 3)
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

}  // namespace
}  // namespace fusekit::kernels
