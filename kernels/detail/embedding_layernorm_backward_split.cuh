// Embedding + LayerNorm sorted backward, step 3 for BERT's rows (16-bit types at 768 and 1024
// columns): the row kernel that splits a token's row over a group of W warps, a 16-byte vector a
// lane, so that more warps are in flight.
#pragma once

#include "kernels/detail/embedding_layernorm_common.cuh"

namespace fusekit::kernels {
// Included by embedding_layernorm.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

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
// vocabulary, that no token uses, after its tokens.
//
// The kernel is bound by memory latency, so what counts is the warps in flight: with a warp a token
// (the whole row in a lane's registers) it took 127 registers and ran 16 warps an SM; a vector a
// lane takes 79 registers at 768 columns (2 blocks of 12 warps an SM) and 64 at 1024 (2 of 16).
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
      // The word rows evict first, as dy: read once here (a few times for a repeated word), they would
      // otherwise push out of L2 the float sums of the repeated words that the tables kernel reads next.
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
    // dword rows of words used once with streaming stores, as the zeros below.
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
  // next.
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

}  // namespace
}  // namespace fusekit::kernels
