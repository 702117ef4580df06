// BERT attention forward: a block per (sequence, head, 64 queries), FlashAttention-2's online
// softmax over the key tiles, scores and O in mma fragments.
#pragma once

#include "kernels/detail/bert_attention_common.cuh"

namespace fusekit::kernels {
// Included by bert_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

template <class T, int D>
__global__ void __launch_bounds__(kThreads, Config<T, D>::kForwardBlocksPerSm)
    bert_attention_forward_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                                  T* __restrict__ out, float* __restrict__ lse, int heads, int seq, float scale,
                                  KeyedDropout dropout) {
  using C = Config<T, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q_tile = reinterpret_cast<T*>(shared);
  T* stages = q_tile + C::kTileElements;  // [stage][K, V]

  const int query_tiles = ceil_div(seq, kTile);
  const int bh = blockIdx.x / query_tiles, first_query = blockIdx.x % query_tiles * kTile;
  const int b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, t = lane % 4;
  const int row = 16 * warp, r0 = row + lane / 4;  // the warp's rows and this lane's first row
  const int valid = min(max(valid_lengths[b], 0), seq);
  const int key_tiles = ceil_div(valid, kTile);
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  const float qk_scale = scale * kLog2e;
  // Stream index of key 0 in rows r0, r0 + 8 (rows past seq draw words nobody uses).
  const uint64_t element0 = (static_cast<uint64_t>(bh) * seq + first_query + r0) * seq;
  const uint64_t element1 = element0 + 8 * static_cast<uint64_t>(seq);

  auto fetch = [&](int tile, int stage) {
    const int first_key = tile * kTile, keys = min(kTile, valid - first_key);
    T* k_tile = stages + 2 * stage * C::kTileElements;
    copy_rows_async<T, D>(k_tile, source + first_key * qkv_stride + heads * D, qkv_stride, keys);
    copy_rows_async<T, D>(k_tile + C::kTileElements, source + first_key * qkv_stride + 2 * heads * D, qkv_stride, keys);
    copy_async_commit();
  };

  float o[C::kDimTiles][4] = {};
  // Running max (log2 domain, the same in the quad's lanes) and this lane's part of the sum, rows r0, r0 + 8.
  float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.f, sum1 = 0.f;
  if (key_tiles > 0) {
    copy_rows_async<T, D>(q_tile, source + first_query * qkv_stride, qkv_stride, min(kTile, seq - first_query));
    fetch(0, 0);  // one group with Q
    for (int tile = 0; tile < key_tiles; ++tile) {
      const int stage = tile & 1;
      // The tile's dropout flags first, while few registers are live (and the copies are in flight).
      uint32_t kept0 = 0xFFFFFFFFu, kept1 = 0xFFFFFFFFu;
      if (dropout.dropping) {
        const uint64_t first_key = static_cast<uint64_t>(tile) * kTile;
        row_dropout_bits(dropout, element0 + first_key, element1 + first_key, lane, kept0, kept1);
      }
      if (tile + 1 < key_tiles) {
        fetch(tile + 1, stage ^ 1);
        copy_async_wait<1>();
      } else {
        copy_async_wait<0>();
      }
      __syncthreads();
      const T* k_tile = stages + 2 * stage * C::kTileElements;
      const T* v_tile = k_tile + C::kTileElements;

      float s[kKeyTiles][4];
      tile_scores<T, D>(s, q_tile, row, k_tile, lane);

      // Online softmax in the log2 domain: keys past the valid length (only in a partial tile) get
      // -inf, the running max is taken on the raw scores and scaled (scale > 0), and P = exp2(S *
      // scale log2(e) - m) in one FMA an element.
      const int keys = valid - tile * kTile;  // >= 1: key 0 of the tile is valid
      if (keys < kTile) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (8 * n + 2 * t + (e & 1) >= keys) s[n][e] = -INFINITY;
      }
      float high0 = -INFINITY, high1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        high0 = fmaxf(high0, fmaxf(s[n][0], s[n][1]));
        high1 = fmaxf(high1, fmaxf(s[n][2], s[n][3]));
      }
      high0 = fmaxf(max0, lane_group_max<4>(high0) * qk_scale);  // finite: every tile holds a valid key
      high1 = fmaxf(max1, lane_group_max<4>(high1) * qk_scale);
      const float alpha0 = exp2f(max0 - high0), alpha1 = exp2f(max1 - high1);  // 0 on the first tile
      max0 = high0;
      max1 = high1;
      float part0 = 0.f, part1 = 0.f;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        s[n][0] = exp2f(fmaf(s[n][0], qk_scale, -high0));
        s[n][1] = exp2f(fmaf(s[n][1], qk_scale, -high0));
        s[n][2] = exp2f(fmaf(s[n][2], qk_scale, -high1));
        s[n][3] = exp2f(fmaf(s[n][3], qk_scale, -high1));
        part0 += s[n][0] + s[n][1];  // the softmax normalises before dropout
        part1 += s[n][2] + s[n][3];
      }
      sum0 = sum0 * alpha0 + part0;
      sum1 = sum1 * alpha1 + part1;
#pragma unroll
      for (int n = 0; n < C::kDimTiles; ++n) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
      }
      if (dropout.dropping) {  // dropped elements become 0; 1 / (1 - p) is applied with 1 / l at the end
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          if (!(kept0 >> (4 * n) & 1u)) s[n][0] = 0.f;
          if (!(kept0 >> (4 * n + 1) & 1u)) s[n][1] = 0.f;
          if (!(kept1 >> (4 * n) & 1u)) s[n][2] = 0.f;
          if (!(kept1 >> (4 * n + 1) & 1u)) s[n][3] = 0.f;
        }
      }
      fragments_times_tile<T, D>(o, s, v_tile, lane);  // O += (P * kept) V; 1 / (1 - p) at the end
      __syncthreads();                                 // the stage is refilled with tile + 2
    }
  }

  // out = O / l (times 1 / (1 - p) with dropout); lse = m + log l (natural log). With no valid key
  // (l = 0): out 0, lse 0.
  sum0 = lane_group_sum<4>(sum0);
  sum1 = lane_group_sum<4>(sum1);
  const float keep = dropout.dropping ? dropout.scale : 1.f;
  store_fragments<T, D>(o, out + static_cast<size_t>(b) * seq * out_stride + h * D, out_stride, first_query + row, seq,
                        sum0 > 0.f ? keep / sum0 : 0.f, sum1 > 0.f ? keep / sum1 : 0.f, lane);
  if (t == 0) {
    float* lse_rows = lse + static_cast<size_t>(bh) * seq + first_query;
    if (first_query + r0 < seq) lse_rows[r0] = sum0 > 0.f ? (max0 + log2f(sum0)) * kLn2 : 0.f;
    if (first_query + r0 + 8 < seq) lse_rows[r0 + 8] = sum1 > 0.f ? (max1 + log2f(sum1)) * kLn2 : 0.f;
  }
}

}  // namespace
}  // namespace fusekit::kernels
