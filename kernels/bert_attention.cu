// BERT attention forward and backward (see bert_attention.h for the math and the layouts).
//
// Design: every kernel runs 128 threads (4 warps) per block over tiles of 64 rows; warp w owns rows
// 16w .. 16w + 15 of the block's own tile (queries in the forward and dQ kernels, keys in the dK/dV
// kernel), so after the block has loaded the shared tiles of a step, a warp's scores, softmax and
// accumulator updates touch only its own rows and need __syncwarp, not __syncthreads. Tiles of T
// are [64][head_dim + 8] (rows past the end zero), scores float [64][72], probabilities T [64][72],
// the float accumulators (O, dQ, dK, dV) [64][head_dim + 8] in shared memory: a wmma accumulator
// is loaded, advanced by one tile product and stored back (kernels/attention_tiles.cuh).
//
// Forward (a block per (sequence, head, 64 queries)): for each key tile up to the valid length,
// S = Q K^T; per row, 16 lanes hold 4 consecutive keys each: the running max m and sum l (float,
// in shared memory) are updated, O's row is scaled by exp(m_old - m_new), P = exp(S - m_new) goes
// through the dropout mask (4 consecutive elements of the Philox stream per lane: one or two
// Philox calls, DropoutStream::kept_bits4) into P's tile as T, and O += P V. O / l and m + log l
// are written once at the end.
//
// Backward, two kernels and no atomics (deterministic): bert_attention_query_kernel per (sequence,
// head, 64 queries) computes D = rowsum(dO * O) (into the workspace) and walks the key tiles for
// dQ; bert_attention_key_kernel per (sequence, head, 64 keys) walks the query tiles for dK and dV,
// computing S^T = K Q^T and dP^T = V dO^T directly (lanes then hold 4 consecutive keys of one
// query, again 4 consecutive elements of the stream). Both recompute P = exp(scale S - lse).
#include <mma.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_tiles.cuh"
#include "kernels/bert_attention.h"
#include "kernels/common.cuh"
#include "kernels/philox.cuh"

namespace fusekit::kernels {
namespace {

using namespace nvcuda;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kTile = 64;  // queries or keys per tile
// 4 warps of 16 rows each. The kernels declare __launch_bounds__(kThreads, 1): with the bare form,
// ptxas capped some backward instantiations near 64 registers and spilled.
constexpr int kThreads = 128;
constexpr int kLdScores = kTile + 8;  // floats per row of S, dP (and their transposes)
constexpr int kLdProbs = kTile + 8;   // T per row of P, dS
constexpr int kMaxHeads = 1024;
constexpr int kMaxSeq = 65536;

// Shared-memory layout of a (T, head dim) instantiation. Every region is a multiple of 32 bytes, so
// every region and every 16-row or 16-column tile in it is 32-byte aligned, as wmma requires.
template <class T, int D>
struct Config {
  static constexpr int kLdTile = D + 8;  // T per row of Q, K, V, dO
  static constexpr int kLdAcc = D + 8;   // floats per row of O, dQ, dK, dV
  static constexpr int kDimTiles = D / 16;
  static constexpr size_t kTileBytes = sizeof(T) * kTile * kLdTile;
  static constexpr size_t kScoresBytes = sizeof(float) * kTile * kLdScores;
  static constexpr size_t kProbsBytes = sizeof(T) * kTile * kLdProbs;
  static constexpr size_t kAccBytes = sizeof(float) * kTile * kLdAcc;
  static constexpr size_t kRowBytes = sizeof(float) * kTile;
  // Forward: Q, K, V, S, P, O, running max and sum per row.
  static constexpr size_t kForwardBytes = 3 * kTileBytes + kScoresBytes + kProbsBytes + kAccBytes + 2 * kRowBytes;
  // dQ kernel: Q, K, V, dO, S, dP, dS, dQ, lse and D per query.
  static constexpr size_t kQueryBytes = 4 * kTileBytes + 2 * kScoresBytes + kProbsBytes + kAccBytes + 2 * kRowBytes;
  // dK/dV kernel: K, V, Q, dO, S^T, dP^T, P^T, dS^T, dK, dV, lse and D per query.
  static constexpr size_t kKeyBytes =
      4 * kTileBytes + 2 * kScoresBytes + 2 * kProbsBytes + 2 * kAccBytes + 2 * kRowBytes;
  static_assert(D % 16 == 0 && kTileBytes % 32 == 0 && kProbsBytes % 32 == 0, "layout");
  static_assert(kTile * (D / 8) % kThreads == 0, "whole passes of the row-dot loop");
  static_assert(kKeyBytes <= 227 * 1024 && kQueryBytes <= 227 * 1024 && kForwardBytes <= 227 * 1024,
                "shared memory of one block on sm_90");
};

// ---- CUDA kernels

// Rows [0, count) of a [count, D] matrix whose rows lie `stride` elements apart in global memory,
// into a tile of kTile rows of kLdTile; rows from count on are zero. 16-byte accesses.
template <class T, int D>
__device__ __forceinline__ void load_rows(T* tile, const T* __restrict__ source, size_t stride, int count) {
  constexpr int kVecs = D / 8;
  for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
    const int r = e / kVecs, c = e % kVecs * 8;
    int4 value = make_int4(0, 0, 0, 0);
    if (r < count) value = __ldg(reinterpret_cast<const int4*>(source + r * stride + c));
    *reinterpret_cast<int4*>(tile + r * Config<T, D>::kLdTile + c) = value;
  }
}

// Zeroes a float accumulator tile [kTile][kLdAcc].
template <class T, int D>
__device__ __forceinline__ void zero_accumulator(float* acc) {
  for (int e = threadIdx.x; e < kTile * Config<T, D>::kLdAcc; e += kThreads) acc[e] = 0.f;
}

// The warp's 16 rows of `scores` (row 16 warp ..) = A B^T over the 4 column tiles: A's rows from
// `a` (row 16 warp on), B's 64 rows from `b`, both [kTile][kLdTile] tiles of T.
template <class T, int D>
__device__ __forceinline__ void warp_scores(const T* a, const T* b, float* scores, int warp) {
  using C = Config<T, D>;
  for (int tj = 0; tj < kTile / 16; ++tj) {
    Accumulator acc;
    // B^T: B's rows tj read col_major.
    multiply_tiles<T, wmma::row_major, wmma::col_major>(acc, a + warp * 16 * C::kLdTile, C::kLdTile, 16,
                                                        b + tj * 16 * C::kLdTile, C::kLdTile, 16, C::kDimTiles);
    wmma::store_matrix_sync(scores + warp * 16 * kLdScores + tj * 16, acc, kLdScores, wmma::mem_row_major);
  }
}

// The warp's 16 rows of the accumulator `acc` (float [kTile][kLdAcc]) += A B, A the warp's 16 rows
// of a [kTile][kLdProbs] tile of T (64 columns), B a [kTile][kLdTile] tile of T (64 rows, D columns).
template <class T, int D>
__device__ __forceinline__ void warp_accumulate(float* acc, const T* a, const T* b, int warp) {
  using C = Config<T, D>;
  for (int tn = 0; tn < C::kDimTiles; ++tn) {
    float* c = acc + warp * 16 * C::kLdAcc + tn * 16;
    Accumulator fragment;
    wmma::load_matrix_sync(fragment, c, C::kLdAcc, wmma::mem_row_major);
    multiply_add_tiles<T, wmma::row_major, wmma::row_major>(fragment, a + warp * 16 * kLdProbs, kLdProbs, 16,
                                                            b + tn * 16, C::kLdTile, 16 * C::kLdTile, kTile / 16);
    wmma::store_matrix_sync(c, fragment, C::kLdAcc, wmma::mem_row_major);
  }
}

// Writes the warp's 16 rows of the accumulator, times factor (per row: row_factor[r] if given, else
// 1) times `factor`, to rows first_row + r < rows of `destination` (rows `stride` elements apart).
template <class T, int D>
__device__ __forceinline__ void warp_store_rows(const float* acc, const float* row_factor, float factor, T* destination,
                                                size_t stride, int first_row, int rows, int warp) {
  using C = Config<T, D>;
  constexpr int kVecs = D / 8;
  const int lane = threadIdx.x % kWarpSize;
  for (int e = lane; e < 16 * kVecs; e += kWarpSize) {
    const int r = warp * 16 + e / kVecs, c = e % kVecs * 8;
    if (first_row + r >= rows) continue;
    const float f = row_factor ? factor * row_factor[r] : factor;
    Vec<T, 8> out;
#pragma unroll
    for (int x = 0; x < 8; ++x) out.v[x] = from_float<T>(f * acc[r * C::kLdAcc + c + x]);
    out.store(destination + (first_row + r) * stride + c);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    bert_attention_forward_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                                  T* __restrict__ out, float* __restrict__ lse, int heads, int seq, float scale,
                                  DropoutStream dropout) {
  using C = Config<T, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q = reinterpret_cast<T*>(shared);
  T* k = reinterpret_cast<T*>(shared + C::kTileBytes);
  T* v = reinterpret_cast<T*>(shared + 2 * C::kTileBytes);
  float* scores = reinterpret_cast<float*>(shared + 3 * C::kTileBytes);
  T* probs = reinterpret_cast<T*>(shared + 3 * C::kTileBytes + C::kScoresBytes);
  float* acc = reinterpret_cast<float*>(shared + 3 * C::kTileBytes + C::kScoresBytes + C::kProbsBytes);
  float* row_max = acc + kTile * C::kLdAcc;
  float* row_sum = row_max + kTile;

  const int query_tiles = ceil_div(seq, kTile);
  const int bh = blockIdx.x / query_tiles, first_query = blockIdx.x % query_tiles * kTile;
  const int b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int valid = min(max(valid_lengths[b], 0), seq);
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;

  load_rows<T, D>(q, source + first_query * qkv_stride, qkv_stride, min(kTile, seq - first_query));
  zero_accumulator<T, D>(acc);
  if (threadIdx.x < kTile) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.f;
  }

  // Softmax lanes: lane g = lane % 16 of row half lane / 16 holds keys 4g .. 4g + 3 of a row.
  const int g = lane % 16, half = lane / 16;
  for (int first_key = 0; first_key < valid; first_key += kTile) {
    const int keys = min(kTile, valid - first_key);  // >= 1: key first_key is valid
    __syncthreads();                                 // the previous tile's K and V are read
    load_rows<T, D>(k, source + first_key * qkv_stride + heads * D, qkv_stride, keys);
    load_rows<T, D>(v, source + first_key * qkv_stride + 2 * heads * D, qkv_stride, keys);
    __syncthreads();
    warp_scores<T, D>(q, k, scores, warp);
    __syncwarp();

#pragma unroll 1
    for (int pass = 0; pass < 8; ++pass) {
      const int r = warp * 16 + 2 * pass + half;
      const float4 s = *reinterpret_cast<const float4*>(scores + r * kLdScores + 4 * g);
      float z[4] = {s.x, s.y, s.z, s.w};
      float high = -INFINITY;
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        z[x] = 4 * g + x < keys ? scale * z[x] : -INFINITY;
        high = fmaxf(high, z[x]);
      }
      high = lane_group_max<16>(high);
      const float old_max = row_max[r];                         // read by every lane before the group's shuffles below
      const float new_max = fmaxf(old_max, high);               // finite: every tile holds a valid key
      const float alpha = exp2f((old_max - new_max) * kLog2e);  // 0 on the first tile
      const uint64_t element = (static_cast<uint64_t>(bh) * seq + first_query + r) * seq + first_key + 4 * g;
      const uint32_t kept = dropout.kept_bits4(element);
      float sum = 0.f;
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float p = exp2f((z[x] - new_max) * kLog2e);  // 0 for masked keys
        sum += p;                                          // the softmax normalises before dropout
        probs[r * kLdProbs + 4 * g + x] = from_float<T>(p * dropout.multiplier(kept, x));
      }
      sum = lane_group_sum<16>(sum);
      if (g == 0) {
        row_max[r] = new_max;
        row_sum[r] = row_sum[r] * alpha + sum;
      }
      for (int c = g; c < D; c += 16) acc[r * C::kLdAcc + c] *= alpha;
    }
    __syncwarp();
    warp_accumulate<T, D>(acc, probs, v, warp);  // O += P V
  }
  __syncthreads();  // row statistics and accumulators of every warp are final (also for valid == 0)

  // out = O / l; lse = m + log l. With no valid key (l = 0): out 0, lse 0.
  float* inverse = scores;  // S is no longer needed: its first row holds 1 / l per row
  if (threadIdx.x < kTile) {
    const int r = threadIdx.x, i = first_query + r;
    const float l = row_sum[r];
    inverse[r] = l > 0.f ? 1.f / l : 0.f;
    if (i < seq) lse[static_cast<size_t>(bh) * seq + i] = l > 0.f ? row_max[r] + logf(l) : 0.f;
  }
  __syncthreads();
  warp_store_rows<T, D>(acc, inverse, 1.f, out + static_cast<size_t>(b) * seq * out_stride + h * D, out_stride,
                        first_query, seq, warp);
}

// D and dQ: a block per (sequence, head, 64 queries).
template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    bert_attention_query_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                                const T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ dout,
                                T* __restrict__ dqkv, float* __restrict__ row_dots, int heads, int seq, float scale,
                                DropoutStream dropout) {
  using C = Config<T, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q = reinterpret_cast<T*>(shared);
  T* k = reinterpret_cast<T*>(shared + C::kTileBytes);
  T* v = reinterpret_cast<T*>(shared + 2 * C::kTileBytes);
  T* dout_tile = reinterpret_cast<T*>(shared + 3 * C::kTileBytes);
  float* scores = reinterpret_cast<float*>(shared + 4 * C::kTileBytes);
  float* dprobs = reinterpret_cast<float*>(shared + 4 * C::kTileBytes + C::kScoresBytes);
  T* dscores = reinterpret_cast<T*>(shared + 4 * C::kTileBytes + 2 * C::kScoresBytes);
  float* acc = reinterpret_cast<float*>(shared + 4 * C::kTileBytes + 2 * C::kScoresBytes + C::kProbsBytes);
  float* row_lse = acc + kTile * C::kLdAcc;
  float* row_d = row_lse + kTile;

  const int query_tiles = ceil_div(seq, kTile);
  const int bh = blockIdx.x / query_tiles, first_query = blockIdx.x % query_tiles * kTile;
  const int b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int valid = min(max(valid_lengths[b], 0), seq);
  const int queries = min(kTile, seq - first_query);
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;

  load_rows<T, D>(q, source + first_query * qkv_stride, qkv_stride, queries);
  zero_accumulator<T, D>(acc);
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
      gradient.store(dout_tile + r * C::kLdTile + c);
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

  const int g = lane % 16, half = lane / 16;
  for (int first_key = 0; first_key < valid; first_key += kTile) {
    const int keys = min(kTile, valid - first_key);
    __syncthreads();  // the previous tile's K and V are read (and, the first time, Q, dO, lse, D written)
    load_rows<T, D>(k, source + first_key * qkv_stride + heads * D, qkv_stride, keys);
    load_rows<T, D>(v, source + first_key * qkv_stride + 2 * heads * D, qkv_stride, keys);
    __syncthreads();
    warp_scores<T, D>(q, k, scores, warp);          // S
    warp_scores<T, D>(dout_tile, v, dprobs, warp);  // dO V^T, before the dropout mask
    __syncwarp();

#pragma unroll 1
    for (int pass = 0; pass < 8; ++pass) {
      const int r = warp * 16 + 2 * pass + half;
      const float4 s = *reinterpret_cast<const float4*>(scores + r * kLdScores + 4 * g);
      const float4 dp = *reinterpret_cast<const float4*>(dprobs + r * kLdScores + 4 * g);
      const float z[4] = {s.x, s.y, s.z, s.w}, dz[4] = {dp.x, dp.y, dp.z, dp.w};
      const float lse_r = row_lse[r], d_r = row_d[r];
      const uint64_t element = (static_cast<uint64_t>(bh) * seq + first_query + r) * seq + first_key + 4 * g;
      const uint32_t kept = dropout.kept_bits4(element);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float p = 4 * g + x < keys ? exp2f((scale * z[x] - lse_r) * kLog2e) : 0.f;
        dscores[r * kLdProbs + 4 * g + x] = from_float<T>(p * (dz[x] * dropout.multiplier(kept, x) - d_r));
      }
    }
    __syncwarp();
    warp_accumulate<T, D>(acc, dscores, k, warp);  // dQ += dS K (scaled at the end)
  }
  __syncthreads();  // the accumulator was zeroed by every warp (no key tile may have followed)
  warp_store_rows<T, D>(acc, nullptr, scale, dqkv + static_cast<size_t>(b) * seq * qkv_stride + h * D, qkv_stride,
                        first_query, seq, warp);
}

// dK and dV: a block per (sequence, head, 64 keys), warp w owning keys 16w .. 16w + 15 of the tile.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    bert_attention_key_kernel(const T* __restrict__ qkv, const int32_t* __restrict__ valid_lengths,
                              const float* __restrict__ lse, const T* __restrict__ dout,
                              const float* __restrict__ row_dots, T* __restrict__ dqkv, int heads, int seq, float scale,
                              DropoutStream dropout) {
  using C = Config<T, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* k = reinterpret_cast<T*>(shared);
  T* v = reinterpret_cast<T*>(shared + C::kTileBytes);
  T* q = reinterpret_cast<T*>(shared + 2 * C::kTileBytes);
  T* dout_tile = reinterpret_cast<T*>(shared + 3 * C::kTileBytes);
  float* scores_t = reinterpret_cast<float*>(shared + 4 * C::kTileBytes);  // S^T [key][query]
  float* dprobs_t = reinterpret_cast<float*>(shared + 4 * C::kTileBytes + C::kScoresBytes);
  T* probs_t = reinterpret_cast<T*>(shared + 4 * C::kTileBytes + 2 * C::kScoresBytes);  // (P * M)^T
  T* dscores_t = reinterpret_cast<T*>(shared + 4 * C::kTileBytes + 2 * C::kScoresBytes + C::kProbsBytes);
  float* acc_k = reinterpret_cast<float*>(shared + 4 * C::kTileBytes + 2 * C::kScoresBytes + 2 * C::kProbsBytes);
  float* acc_v = acc_k + kTile * C::kLdAcc;
  float* row_lse = acc_v + kTile * C::kLdAcc;
  float* row_d = row_lse + kTile;

  const int key_tiles = ceil_div(seq, kTile);
  const int bh = blockIdx.x / key_tiles, first_key = blockIdx.x % key_tiles * kTile;
  const int b = bh / heads, h = bh % heads;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int valid = min(max(valid_lengths[b], 0), seq);
  const int keys = min(kTile, valid - first_key);  // valid keys of the tile; <= 0: dK = dV = 0
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;
  const T* source = qkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;

  zero_accumulator<T, D>(acc_k);
  zero_accumulator<T, D>(acc_v);
  if (keys > 0) {
    load_rows<T, D>(k, source + first_key * qkv_stride + heads * D, qkv_stride, keys);
    load_rows<T, D>(v, source + first_key * qkv_stride + 2 * heads * D, qkv_stride, keys);
    // Elementwise lanes: lane `column` = lane / 4 takes queries column, column + 8, ...; lane
    // quarter = lane % 4 holds keys 4 quarter .. 4 quarter + 3 of the warp's 16.
    const int column = lane / 4, quarter = lane % 4;
    const int key_row = warp * 16 + 4 * quarter;  // first key of the lane, in the tile
    for (int first_query = 0; first_query < seq; first_query += kTile) {
      const int queries = min(kTile, seq - first_query);
      __syncthreads();  // the previous query tile is read
      load_rows<T, D>(q, source + first_query * qkv_stride, qkv_stride, queries);
      load_rows<T, D>(dout_tile, dout + (static_cast<size_t>(b) * seq + first_query) * out_stride + h * D, out_stride,
                      queries);
      if (threadIdx.x < kTile) {
        const int r = threadIdx.x;
        const size_t at = static_cast<size_t>(bh) * seq + first_query + r;
        row_lse[r] = r < queries ? lse[at] : INFINITY;  // padded queries: P = 0
        row_d[r] = r < queries ? row_dots[at] : 0.f;
      }
      __syncthreads();
      warp_scores<T, D>(k, q, scores_t, warp);          // S^T = K Q^T
      warp_scores<T, D>(v, dout_tile, dprobs_t, warp);  // (dO V^T)^T = V dO^T
      __syncwarp();

#pragma unroll 1
      for (int pass = 0; pass < 8; ++pass) {
        const int c = pass * 8 + column;  // query in the tile
        const float lse_c = row_lse[c], d_c = row_d[c];
        const uint64_t element = (static_cast<uint64_t>(bh) * seq + first_query + c) * seq + first_key + key_row;
        const uint32_t kept = dropout.kept_bits4(element);
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int r = key_row + x;
          const float p = r < keys ? exp2f((scale * scores_t[r * kLdScores + c] - lse_c) * kLog2e) : 0.f;
          const float m = dropout.multiplier(kept, x);
          probs_t[r * kLdProbs + c] = from_float<T>(p * m);
          dscores_t[r * kLdProbs + c] = from_float<T>(p * (dprobs_t[r * kLdScores + c] * m - d_c));
        }
      }
      __syncwarp();
      warp_accumulate<T, D>(acc_v, probs_t, dout_tile, warp);  // dV += (P * M)^T dO
      warp_accumulate<T, D>(acc_k, dscores_t, q, warp);        // dK += dS^T Q (scaled at the end)
    }
  }
  __syncthreads();  // the accumulators were zeroed by every warp (no query tile may have followed)
  T* destination = dqkv + static_cast<size_t>(b) * seq * qkv_stride + h * D;
  warp_store_rows<T, D>(acc_k, nullptr, scale, destination + heads * D, qkv_stride, first_key, seq, warp);
  warp_store_rows<T, D>(acc_v, nullptr, 1.f, destination + 2 * heads * D, qkv_stride, first_key, seq, warp);
}

// ---- kernel launchers

template <class T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>, head dim) with compile-time values; the shape is checked before.
template <class FN>
void dispatch(DType dtype, int head_dim, FN&& fn) {
  auto by_dim = [&](auto type) {
    if (head_dim == 32)
      fn(type, std::integral_constant<int, 32>{});
    else if (head_dim == 64)
      fn(type, std::integral_constant<int, 64>{});
    else
      fn(type, std::integral_constant<int, 128>{});
  };
  if (dtype == DType::f16)
    by_dim(TypeTag<__half>{});
  else
    by_dim(TypeTag<__nv_bfloat16>{});
}

void check_aligned(const void* p, const char* name) {
  if (!aligned16(p)) throw std::invalid_argument(std::string("bert_attention: ") + name + " must be 16-byte aligned");
}

}  // namespace

void check_bert_attention(DType dtype, const BertAttentionShape& s, float p) {
  std::string problem;
  if (dtype != DType::f16 && dtype != DType::bf16) {
    problem = std::string("dtype ") + dtype_name(dtype) + " is not supported (fp16, bf16)";
  } else if (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128) {
    problem = "head_dim must be 32, 64 or 128, got " + std::to_string(s.head_dim);
  } else if (s.heads < 1 || s.heads > kMaxHeads) {
    problem = "heads must be in [1, " + std::to_string(kMaxHeads) + "], got " + std::to_string(s.heads);
  } else if (s.seq < 1 || s.seq > kMaxSeq) {
    problem = "seq must be in [1, " + std::to_string(kMaxSeq) + "], got " + std::to_string(s.seq);
  } else if (s.batch < 0) {
    problem = "batch must be >= 0, got " + std::to_string(s.batch);
  } else if (static_cast<long long>(s.batch) * s.heads * ceil_div(s.seq, kTile) > (1LL << 31) - 1) {
    problem = "batch x heads x ceil(seq / 64) must be below 2^31";
  } else if (!(p >= 0.f && p < 1.f)) {
    problem = "dropout p must be in [0, 1), got " + std::to_string(p);
  }
  if (!problem.empty()) throw std::invalid_argument("bert_attention: " + problem);
}

void bert_attention_forward(DType dtype, const void* qkv, const int32_t* valid_lengths, void* out, float* lse,
                            const BertAttentionShape& s, float scale, const BertAttentionDropout& dropout,
                            cudaStream_t stream) {
  check_bert_attention(dtype, s, dropout.p);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  if (s.batch == 0) return;
  const DropoutStream stream_of_dropout = dropout_stream(dropout.p, dropout.seed, dropout.offset);
  const int blocks = s.batch * s.heads * ceil_div(s.seq, kTile);
  dispatch(dtype, s.head_dim, [&](auto type, auto d) {
    using T = typename decltype(type)::type;
    constexpr int D = decltype(d)::value;
    using C = Config<T, D>;
    allow_shared<bert_attention_forward_kernel<T, D>>(C::kForwardBytes);
    bert_attention_forward_kernel<T, D><<<blocks, kThreads, C::kForwardBytes, stream>>>(
        static_cast<const T*>(qkv), valid_lengths, static_cast<T*>(out), lse, s.heads, s.seq, scale, stream_of_dropout);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

size_t bert_attention_backward_workspace_bytes(const BertAttentionShape& s) {
  return sizeof(float) * static_cast<size_t>(std::max(s.batch, 0)) * std::max(s.heads, 0) * std::max(s.seq, 0);
}

void bert_attention_backward(DType dtype, const void* qkv, const int32_t* valid_lengths, const void* out,
                             const float* lse, const void* dout, void* dqkv, void* workspace,
                             const BertAttentionShape& s, float scale, const BertAttentionDropout& dropout,
                             cudaStream_t stream) {
  check_bert_attention(dtype, s, dropout.p);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  check_aligned(dout, "dout");
  check_aligned(dqkv, "dqkv");
  if (s.batch == 0) return;
  const DropoutStream stream_of_dropout = dropout_stream(dropout.p, dropout.seed, dropout.offset);
  const int blocks = s.batch * s.heads * ceil_div(s.seq, kTile);
  float* row_dots = static_cast<float*>(workspace);
  dispatch(dtype, s.head_dim, [&](auto type, auto d) {
    using T = typename decltype(type)::type;
    constexpr int D = decltype(d)::value;
    using C = Config<T, D>;
    allow_shared<bert_attention_query_kernel<T, D>>(C::kQueryBytes);
    bert_attention_query_kernel<T, D><<<blocks, kThreads, C::kQueryBytes, stream>>>(
        static_cast<const T*>(qkv), valid_lengths, static_cast<const T*>(out), lse, static_cast<const T*>(dout),
        static_cast<T*>(dqkv), row_dots, s.heads, s.seq, scale, stream_of_dropout);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    allow_shared<bert_attention_key_kernel<T, D>>(C::kKeyBytes);
    bert_attention_key_kernel<T, D><<<blocks, kThreads, C::kKeyBytes, stream>>>(
        static_cast<const T*>(qkv), valid_lengths, lse, static_cast<const T*>(dout), row_dots, static_cast<T*>(dqkv),
        s.heads, s.seq, scale, stream_of_dropout);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace fusekit::kernels
