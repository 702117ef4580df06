// Embedding + LayerNorm sorted backward, steps 1 to 3 for general rows: zeroing and counting the
// tokens by word and position, ordering them by position, and the block row kernel (G row groups a
// block) that sums de per run of one position before any atomic.
#pragma once

#include "kernels/detail/embedding_layernorm_common.cuh"

namespace fusekit::kernels {
// Included by embedding_layernorm.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

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
// written only for words used more than once: the others' values go unused.) The sweep runs in
// blocks of its own, beside the token blocks, rather than after each block's tokens: it then
// overlaps the scatter.
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
// blocks, and so these per-block costs, fewer. Last, the block zeroes the rows of dword, among its
// share of the vocabulary, that no token uses. The shared sums are laid out so that a warp's float4
// accesses hit consecutive words (with column c at c, 8 threads of a warp shared a bank and the
// kernel was bound by L1). Registers are capped at 64 for 1024 threads an SM.
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

}  // namespace
}  // namespace fusekit::kernels
