// BERT attention backward of a whole head in one block (seq <= 128, head_dim <= 64): the scores
// computed once, dS^T through shared memory for dQ, no workspace, no atomics.
#pragma once

#include "kernels/detail/bert_attention_common.cuh"

namespace fusekit::kernels {
// Included by bert_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

// The backward of a whole head in one block, for seq <= 16 WARPS and head_dim <= 64: WARPS warps per
// (sequence, head), warp w owning keys 16w .. 16w + 15 as rows (as the dK/dV kernel) and, after a
// barrier, queries 16w .. 16w + 15 for dQ. Every key and query of the head is in shared memory, so
// the scores are computed once (not once per kernel), D = rowsum(dO * O) needs no workspace, and
// dQ = scale dS K is summed over every key inside the block: no atomics, deterministic. The warps
// write dS^T (rounded to T, as the dQ kernel rounds dS for its products) to shared memory while
// they sum dK and dV, and read it back as the left operand of dQ (ldmatrix.trans). At BERT-base
// (64 x 12 x 128 x 64, fp16) it takes 80.3 us against 116.1 us for the dQ and dK/dV kernels.
template <class T, int D, int WARPS>
struct HeadConfig {
  static constexpr int kRows = 16 * WARPS;  // keys and queries a block holds: seq <= kRows
  static constexpr int kThreads = kWarpSize * WARPS;
  static constexpr int kMatrixElements = kRows * Config<T, D>::kLd;
  static constexpr int kScoresLd = kRows + 8;  // T per dS^T row: 16-byte rows 4 banks apart
  static constexpr int kScoresRowBytes = sizeof(T) * kScoresLd;
  // K, V, Q, dO, dS^T, then lse and D per query.
  static constexpr size_t kBytes = sizeof(T) * (4 * kMatrixElements + kRows * kScoresLd) + 2 * sizeof(float) * kRows;
  // 16 warps an SM (128 registers a thread), as the two-kernel backward where D <= 64.
  static constexpr int kBlocksPerSm = 16 / WARPS;
  static_assert(D <= 64, "the dK and dV accumulators of D = 128 leave no registers for the scores");
  static_assert(kRows * (D / 8) % kThreads == 0, "whole passes of the row-dot loop");
  static_assert(kBlocksPerSm * (kBytes + 1024) <= 228 * 1024, "shared memory of the blocks an SM on sm_90");
};

template <class T, int D, int WARPS>
__global__ void __launch_bounds__(HeadConfig<T, D, WARPS>::kThreads, HeadConfig<T, D, WARPS>::kBlocksPerSm)
    bert_attention_head_backward_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                                        const T* __restrict__ out, const float* __restrict__ lse,
                                        const T* __restrict__ dout, T* __restrict__ dqkv, int heads, int seq,
                                        float scale, KeyedDropout dropout) {
  using C = Config<T, D>;
  using H = HeadConfig<T, D, WARPS>;
  using F = Fragments<T, D>;
  constexpr int kRows = H::kRows;
  extern __shared__ __align__(128) unsigned char shared[];
  T* k_rows = reinterpret_cast<T*>(shared);
  T* v_rows = k_rows + H::kMatrixElements;
  T* q_rows = v_rows + H::kMatrixElements;
  T* dout_rows = q_rows + H::kMatrixElements;
  T* ds_rows = dout_rows + H::kMatrixElements;  // dS^T: [key][query]
  float* row_lse = reinterpret_cast<float*>(ds_rows + kRows * H::kScoresLd);
  float* row_d = row_lse + kRows;

  const int bh = blockIdx.x, b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int row = 16 * warp;
  const int valid = min(max(valid_lengths[b], 0), seq);
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  T* destination = dqkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  float dk[C::kDimTiles][4] = {}, dv[C::kDimTiles][4] = {};
  if (valid == 0) {  // no key: every gradient 0 (the same for the whole block)
    store_fragments<T, D>(dk, destination, qkv_stride, row, seq, 1.f, 1.f, lane);
    store_fragments<T, D>(dk, destination + heads * D, qkv_stride, row, seq, 1.f, 1.f, lane);
    store_fragments<T, D>(dk, destination + 2 * heads * D, qkv_stride, row, seq, 1.f, 1.f, lane);
    return;
  }

  // K and V (the valid keys; the other rows zero) and Q in flight while dO is stored and D computed.
  copy_rows_async<T, D, kRows, H::kThreads>(k_rows, source + heads * D, qkv_stride, valid);
  copy_rows_async<T, D, kRows, H::kThreads>(v_rows, source + 2 * heads * D, qkv_stride, valid);
  copy_rows_async<T, D, kRows, H::kThreads>(q_rows, source, qkv_stride, seq);
  copy_async_commit();
  {
    constexpr int kVecs = D / 8;
    const size_t first = static_cast<size_t>(b) * seq * out_stride + h * D;
    for (int e = threadIdx.x; e < kRows * kVecs; e += H::kThreads) {
      const int r = e / kVecs, c = e % kVecs * 8;
      Vec<T, 8> gradient;
      float dot = 0.f;
      if (r < seq) {
        const Vec<T, 8> o = Vec<T, 8>::load(out + first + r * out_stride + c);
        gradient = Vec<T, 8>::load(dout + first + r * out_stride + c);
#pragma unroll
        for (int x = 0; x < 8; ++x) dot += to_float(o.v[x]) * to_float(gradient.v[x]);
      } else {
#pragma unroll
        for (int x = 0; x < 8; ++x) gradient.v[x] = from_float<T>(0.f);
      }
      dot = lane_group_sum<kVecs>(dot);
      gradient.store(dout_rows + r * C::kLd + c);
      if (c == 0) row_d[r] = dot;
    }
  }
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    row_lse[r] = r < seq ? lse[static_cast<size_t>(bh) * seq + r] : INFINITY;  // P = 0
  }
  copy_async_wait<0>();
  __syncthreads();

  // dK and dV, and dS^T into shared memory. A warp whose 16 keys are all masked skips to dK = dV =
  // 0; the dQ products below never read its rows of dS^T.
  if (row < valid) {
    const float qk_scale = scale * kLog2e;
    const float keep_scale = dropout.dropping ? dropout.scale : 1.f;
    // The dK/dV kernel's draws (column_dropout_bits), its key tile being the whole head.
    const uint64_t element = (static_cast<uint64_t>(bh) * seq + 2 * t + (g & 1)) * seq + row + 8 * (g / 2 % 2);
    const bool key0_inside = row + g < valid, key1_inside = row + g + 8 < valid;
    const int query_tiles = ceil_div(seq, kTile);
    constexpr int N = C::kQueries;
    for (int tile = 0; tile < query_tiles; ++tile) {
      uint32_t kept[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
      if (dropout.dropping)
        column_dropout_bits(dropout, element + static_cast<uint64_t>(tile) * kTile * seq, seq, lane, kept);
#pragma unroll 1
      for (int part = 0; part < kKeyTiles / N; ++part) {
        const int first_query = kTile * tile + 8 * N * part;
        const T* q_part = q_rows + first_query * C::kLd;
        const T* dout_part = dout_rows + first_query * C::kLd;
        float p[N][4], ds[N][4];
        tile_scores<T, D, N>(p, k_rows, row, q_part, lane);
        tile_scores<T, D, N>(ds, v_rows, row, dout_part, lane);
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const int j = N * part + n;  // the 8-query tile of the 64
          const float2 lse_pair = *reinterpret_cast<const float2*>(row_lse + first_query + 8 * n + 2 * t);
          const float2 d_pair = *reinterpret_cast<const float2*>(row_d + first_query + 8 * n + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = e & 1;
            const bool inside = e < 2 ? key0_inside : key1_inside;
            const float prob = inside ? exp2f(fmaf(p[n][e], qk_scale, -(x ? lse_pair.y : lse_pair.x) * kLog2e)) : 0.f;
            const float m = (kept[e] >> kept_bit(j)) & 1u ? keep_scale : 0.f;
            ds[n][e] = prob * (ds[n][e] * m - (x ? d_pair.y : d_pair.x));
            p[n][e] = prob * m;
          }
          T* at = ds_rows + (row + g) * H::kScoresLd + first_query + 8 * n + 2 * t;
          *reinterpret_cast<uint32_t*>(at) = pack_pair<T>(ds[n][0], ds[n][1]);
          *reinterpret_cast<uint32_t*>(at + 8 * H::kScoresLd) = pack_pair<T>(ds[n][2], ds[n][3]);
        }
        fragments_times_tile<T, D, N>(dv, p, dout_part, lane);  // dV += (P * M)^T dO
        fragments_times_tile<T, D, N>(dk, ds, q_part, lane);    // dK += dS^T Q (scaled at the end)
      }
    }
  }
  store_fragments<T, D>(dk, destination + heads * D, qkv_stride, row, seq, scale, scale, lane);
  store_fragments<T, D>(dv, destination + 2 * heads * D, qkv_stride, row, seq, 1.f, 1.f, lane);
  __syncthreads();  // dS^T complete

  // dQ = scale dS K for queries 16w .. 16w + 15, over the 16-key steps that hold a valid key. The A
  // fragments come from dS^T: ldmatrix.trans, lane L addressing key row L % 8 + 8 (L / 16) at query
  // column 8 (L / 8 % 2), so matrices 0..3 are (queries 0-7 | 8-15) x (keys 0-7 | 8-15) as load_a's.
  if (row < seq) {
    float dq[C::kDimTiles][4] = {};
    const int key_steps = ceil_div(valid, 16);
    const uint32_t ds_base = shared_address(ds_rows) + (lane % 8 + lane / 16 * 8) * H::kScoresRowBytes +
                             (lane / 8 & 1) * 16 + sizeof(T) * row;
    const uint32_t k_base = shared_address(k_rows) + F::b_columns_lane(lane);
#pragma unroll
    for (int kc = 0; kc < WARPS; ++kc) {
      if (kc < key_steps) {
        uint32_t a[4];
        load_matrix_x4_transposed(a, ds_base + 16 * kc * H::kScoresRowBytes);
#pragma unroll
        for (int n = 0; n < C::kDimTiles; n += 2) {
          uint32_t y[4];
          F::load_b_columns(y, k_base + 16 * kc * F::kRowBytes + 16 * n);
          mma_16816<T>(dq[n], a, y[0], y[1]);
          mma_16816<T>(dq[n + 1], a, y[2], y[3]);
        }
      }
    }
    store_fragments<T, D>(dq, destination, qkv_stride, row, seq, scale, scale, lane);
  }
}

}  // namespace
}  // namespace fusekit::kernels
