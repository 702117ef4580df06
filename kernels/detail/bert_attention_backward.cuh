// BERT attention backward in two kernels, for sequences longer than a block-per-head backward
// holds: bert_attention_query_kernel (D and dQ, a block per 64 queries) and bert_attention_key_kernel
// (dK and dV, a block per 64 keys). No atomics.
#pragma once

#include "kernels/detail/bert_attention_common.cuh"

namespace fusekit::kernels {
// Included by bert_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

// D and dQ: a block per (sequence, head, 64 queries).
template <class T, int D>
__global__ void __launch_bounds__(kThreads, Config<T, D>::kBackwardBlocksPerSm)
    bert_attention_query_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                                const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                                T* __restrict__ dqkv, float* __restrict__ row_dots, int heads, int seq, float scale,
                                KeyedDropout dropout) {
  using C = Config<T, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q_tile = reinterpret_cast<T*>(shared);
  T* dout_tile = q_tile + C::kTileElements;
  T* stages = dout_tile + C::kTileElements;  // [stage][K, V]
  float* row_lse = reinterpret_cast<float*>(stages + 4 * C::kTileElements);
  float* row_d = row_lse + kTile;

  const int query_tiles = ceil_div(seq, kTile);
  const int bh = blockIdx.x / query_tiles, first_query = blockIdx.x % query_tiles * kTile;
  const int b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, t = lane % 4;
  const int row = 16 * warp, r0 = row + lane / 4;
  const int valid = min(max(valid_lengths[b], 0), seq);
  const int key_tiles = ceil_div(valid, kTile);
  const int queries = min(kTile, seq - first_query);
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  const float qk_scale = scale * kLog2e;
  const uint64_t element0 = (static_cast<uint64_t>(bh) * seq + first_query + r0) * seq;
  const uint64_t element1 = element0 + 8 * static_cast<uint64_t>(seq);

  auto fetch = [&](int tile, int stage) {
    const int first_key = tile * kTile, keys = min(kTile, valid - first_key);
    T* k_tile = stages + 2 * stage * C::kTileElements;
    copy_rows_async<T, D>(k_tile, source + first_key * qkv_stride + heads * D, qkv_stride, keys);
    copy_rows_async<T, D>(k_tile + C::kTileElements, source + first_key * qkv_stride + 2 * heads * D, qkv_stride, keys);
    copy_async_commit();
  };
  if (key_tiles > 0) {
    copy_rows_async<T, D>(q_tile, source + first_query * qkv_stride, qkv_stride, queries);
    fetch(0, 0);  // one group with Q
  }

  // dO into its tile, and D_i = dO_i . O_i: a group of D / 8 lanes per row, 8 elements each (every
  // thread runs every iteration: the groups' shuffles need whole warps).
  {
    constexpr int kVecs = D / 8;
    const size_t first = (static_cast<size_t>(b) * seq + first_query) * out_stride + h * D;
    for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
      const int r = e / kVecs, c = e % kVecs * 8;
      Vec<T, 8> gradient;
      float dot = 0.f;
      if (r < queries) {
        const Vec<T, 8> o = Vec<T, 8>::load(out + first + r * out_stride + c);
        gradient = Vec<T, 8>::load(dout + first + r * out_stride + c);
#pragma unroll
        for (int x = 0; x < 8; ++x) dot += to_float(o.v[x]) * to_float(gradient.v[x]);
      } else {
#pragma unroll
        for (int x = 0; x < 8; ++x) gradient.v[x] = from_float<T>(0.f);
      }
      dot = lane_group_sum<kVecs>(dot);
      gradient.store(dout_tile + r * C::kLd + c);
      if (c == 0) {
        row_d[r] = dot;
        if (r < queries) row_dots[static_cast<size_t>(bh) * seq + first_query + r] = dot;
      }
    }
  }
  if (threadIdx.x < kTile) {
    const int r = threadIdx.x;
    row_lse[r] = r < queries ? lse[static_cast<size_t>(bh) * seq + first_query + r] : INFINITY;  // P = 0
  }

  float dq[C::kDimTiles][4] = {};
  for (int tile = 0; tile < key_tiles; ++tile) {
    const int stage = tile & 1;
    uint32_t kept0 = 0xFFFFFFFFu, kept1 = 0xFFFFFFFFu;  // drawn while few registers are live
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
    __syncthreads();  // (the first time also dO, lse and D)
    const T* k_tile = stages + 2 * stage * C::kTileElements;
    const T* v_tile = k_tile + C::kTileElements;
    const float lse0 = row_lse[r0] * kLog2e, lse1 = row_lse[r0 + 8] * kLog2e;
    const float d0 = row_d[r0], d1 = row_d[r0 + 8];

    const int keys = valid - tile * kTile;
    const float keep_scale = dropout.dropping ? dropout.scale : 1.f;
    constexpr int N = C::kKeys;  // 8-key tiles at a time
#pragma unroll
    for (int part = 0; part < kKeyTiles / N; ++part) {
      const T* k_part = k_tile + 8 * N * part * C::kLd;
      float p[N][4], ds[N][4];
      tile_scores<T, D, N>(p, q_tile, row, k_part, lane);
      tile_scores<T, D, N>(ds, dout_tile, row, v_tile + 8 * N * part * C::kLd, lane);  // dP = dO V^T, unmasked
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int n = N * part + i;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e & 1;
          const bool inside = keys >= kTile || 8 * n + 2 * t + x < keys;
          const float prob = inside ? exp2f(fmaf(p[i][e], qk_scale, -(e < 2 ? lse0 : lse1))) : 0.f;
          const float m = ((e < 2 ? kept0 : kept1) >> (4 * n + x)) & 1u ? keep_scale : 0.f;
          ds[i][e] = prob * (ds[i][e] * m - (e < 2 ? d0 : d1));
        }
      }
      fragments_times_tile<T, D, N>(dq, ds, k_part, lane);  // dQ += dS K (scaled at the end)
    }
    __syncthreads();  // the stage is refilled with tile + 2
  }
  store_fragments<T, D>(dq, dqkv + static_cast<size_t>(b) * seq * qkv_stride + h * D, qkv_stride, first_query + row,
                        seq, scale, scale, lane);
}

// dK and dV: a block per (sequence, head, 64 keys), warp w owning keys 16w .. 16w + 15 of the tile.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, Config<T, D>::kBackwardBlocksPerSm)
    bert_attention_key_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                              const float* __restrict__ lse, const T* __restrict__ dout,
                              const float* __restrict__ row_dots, T* __restrict__ dqkv, int heads, int seq, float scale,
                              KeyedDropout dropout) {
  using C = Config<T, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* k_tile = reinterpret_cast<T*>(shared);
  T* v_tile = k_tile + C::kTileElements;
  T* stages = v_tile + C::kTileElements;                                  // [stage][Q, dO]
  float* rows = reinterpret_cast<float*>(stages + 4 * C::kTileElements);  // [stage][lse, D][kTile]

  const int key_tiles = ceil_div(seq, kTile);
  const int bh = blockIdx.x / key_tiles, first_key = blockIdx.x % key_tiles * kTile;
  const int b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int row = 16 * warp;
  const int valid = min(max(valid_lengths[b], 0), seq);
  const int keys = min(kTile, valid - first_key);  // valid keys of the tile; <= 0: dK = dV = 0
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  const float qk_scale = scale * kLog2e;
  // Stream index of (query 2t + (g & 1), key 8 (g / 2 % 2) of the warp's 16) in query tile 0; the
  // lane's draws (column_dropout_bits).
  const uint64_t element =
      (static_cast<uint64_t>(bh) * seq + 2 * t + (g & 1)) * seq + first_key + row + 8 * (g / 2 % 2);
  const bool key0_inside = row + g < keys, key1_inside = row + g + 8 < keys;

  auto fetch = [&](int tile, int stage) {
    const int first_query = tile * kTile, queries = min(kTile, seq - first_query);
    T* q_tile = stages + 2 * stage * C::kTileElements;
    copy_rows_async<T, D>(q_tile, source + first_query * qkv_stride, qkv_stride, queries);
    copy_rows_async<T, D>(q_tile + C::kTileElements,
                          dout + (static_cast<size_t>(b) * seq + first_query) * out_stride + h * D, out_stride,
                          queries);
    // lse (threads 0..63) and D (64..127) per query; padded queries get lse = +inf: P = 0.
    const int r = threadIdx.x % kTile;
    float* to = rows + (2 * stage + threadIdx.x / kTile) * kTile + r;
    const size_t at = static_cast<size_t>(bh) * seq + first_query + r;
    if (r < queries)
      copy_async4(to, threadIdx.x < kTile ? lse + at : row_dots + at);
    else
      *to = threadIdx.x < kTile ? INFINITY : 0.f;
    copy_async_commit();
  };

  float dk[C::kDimTiles][4] = {}, dv[C::kDimTiles][4] = {};
  if (keys > 0) {
    copy_rows_async<T, D>(k_tile, source + first_key * qkv_stride + heads * D, qkv_stride, keys);
    copy_rows_async<T, D>(v_tile, source + first_key * qkv_stride + 2 * heads * D, qkv_stride, keys);
    fetch(0, 0);  // one group with K and V
    const int query_tiles = ceil_div(seq, kTile);
    const float keep_scale = dropout.dropping ? dropout.scale : 1.f;
    for (int tile = 0; tile < query_tiles; ++tile) {
      const int stage = tile & 1;
      uint32_t kept[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};  // drawn while few registers are live
      if (dropout.dropping)
        column_dropout_bits(dropout, element + static_cast<uint64_t>(tile) * kTile * seq, seq, lane, kept);
      if (tile + 1 < query_tiles) {
        fetch(tile + 1, stage ^ 1);
        copy_async_wait<1>();
      } else {
        copy_async_wait<0>();
      }
      __syncthreads();
      const T* q_tile = stages + 2 * stage * C::kTileElements;
      const T* dout_tile = q_tile + C::kTileElements;
      const float* row_lse = rows + 2 * stage * kTile;
      const float* row_d = row_lse + kTile;

      // Keys as rows: P^T = exp2(S^T - lse) and dP^T = V dO^T with queries 8n + 2t, + 1 as
      // columns, kQueries 8-query tiles at a time.
      constexpr int N = C::kQueries;
#pragma unroll 1
      for (int part = 0; part < kKeyTiles / N; ++part) {
        const T* q_part = q_tile + 8 * N * part * C::kLd;
        const T* dout_part = dout_tile + 8 * N * part * C::kLd;
        float p[N][4], ds[N][4];
        tile_scores<T, D, N>(p, k_tile, row, q_part, lane);
        tile_scores<T, D, N>(ds, v_tile, row, dout_part, lane);
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const int j = N * part + n;  // the 8-query tile
          const float2 lse_pair = *reinterpret_cast<const float2*>(row_lse + 8 * j + 2 * t);
          const float2 d_pair = *reinterpret_cast<const float2*>(row_d + 8 * j + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = e & 1;
            const bool inside = e < 2 ? key0_inside : key1_inside;
            const float prob = inside ? exp2f(fmaf(p[n][e], qk_scale, -(x ? lse_pair.y : lse_pair.x) * kLog2e)) : 0.f;
            const float m = (kept[e] >> kept_bit(j)) & 1u ? keep_scale : 0.f;
            ds[n][e] = prob * (ds[n][e] * m - (x ? d_pair.y : d_pair.x));
            p[n][e] = prob * m;
          }
        }
        fragments_times_tile<T, D, N>(dv, p, dout_part, lane);  // dV += (P * M)^T dO
        fragments_times_tile<T, D, N>(dk, ds, q_part, lane);    // dK += dS^T Q (scaled at the end)
      }
      __syncthreads();  // the stage is refilled with tile + 2
    }
  }
  T* destination = dqkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  store_fragments<T, D>(dk, destination + heads * D, qkv_stride, first_key + row, seq, scale, scale, lane);
  store_fragments<T, D>(dv, destination + 2 * heads * D, qkv_stride, first_key + row, seq, 1.f, 1.f, lane);
}

}  // namespace
}  // namespace fusekit::kernels
