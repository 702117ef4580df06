// BERT attention forward and backward (see bert_attention.h for the math and the layouts).
//
// Design (FlashAttention-2 on mma.sync, kernels/mma_fragments.cuh): the forward, dQ and dK/dV kernels
// run 128 threads (4 warps) per block over tiles of 64 rows, warp w owning rows 16w .. 16w + 15 of
// the block's own tile (queries in the forward and dQ kernels, keys in the dK/dV kernel); the
// block-per-head backward runs 4 or 8 warps over one tile of 64 or 128 rows. Scores, probabilities,
// their gradients and every accumulator (O, dQ, dK, dV) stay in mma fragments: lane 4g + t holds
// rows g and g + 8 of its warp's 16 at columns 8n + 2t, 2t + 1 of each 8-column tile n, and a
// product's scores become the next product's left operand without leaving registers. Shared
// memory holds only the tiles of T ([64][head_dim + 8], rows past the end zero, so ldmatrix reads
// them without bank conflicts); the tiles a kernel walks are double-buffered with cp.async, the
// next tile's copies in flight while the current one is computed.
//
// Forward (a block per (sequence, head, 64 queries), 4 blocks an SM where D <= 64): for each key
// tile up to the valid length, S = Q K^T, the running max (log2 domain) and sum per row updated over
// the 4 lanes of a quad, O scaled by exp2(m_old - m_new), P = exp2(S * scale log2(e) - m_new) in one
// FMA an element, dropped elements zeroed and O += P V. O / l (times 1 / (1 - p)) and the lse are
// written once at the end.
//
// Backward, no atomics (deterministic), P recomputed as exp2(S - lse). Where seq <= 128 and D <=
// 64, bert_attention_head_backward_kernel holds a whole head per block (see there). Otherwise two
// kernels: bert_attention_query_kernel per (sequence, head, 64 queries) computes D = rowsum(dO * O)
// (into the workspace) and walks the key tiles for dQ; bert_attention_key_kernel per (sequence,
// head, 64 keys) walks the query tiles for dK and dV, computing S^T = K Q^T and dP^T = V dO^T
// directly, so P^T and dS^T are left operands in registers too.
//
// Dropout: element (i, j) of the Philox stream is ((b * heads + h) * seq + i) * seq + j. In the
// forward and dQ kernels, the lanes of a quad draw the 16 (row, 8-key tile) pairs of their rows once
// each, 8 flags a Philox call (dropout_kept_bits8: one call, or two where the 8 straddle two of the
// stream's groups of 8), and exchange the flags with shuffles (row_dropout_bits); in the dK/dV
// kernel the 8 lanes that hold the same queries draw their (query, 8 keys) pairs once each
// (column_dropout_bits). Each element's draw is made once per kernel, and the round keys are kernel
// parameters (KeyedDropout::keys), read from the constant bank.
//
// Build with -DFUSEKIT_BERT_PAIR_LOADS to read the fragments with plain 32-bit and 16-bit shared
// loads (the pattern of window_attention.cu) instead of ldmatrix, to isolate a fragment-layout bug
// (all but the block-per-head kernel's dS^T fragments, which only ldmatrix.trans reads).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_tiles.cuh"
#include "kernels/bert_attention.h"
#include "kernels/common.cuh"
#include "kernels/mma_fragments.cuh"
#include "kernels/philox.cuh"

namespace fusekit::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kTile = 64;             // queries or keys per tile
constexpr int kThreads = 128;         // 4 warps of 16 rows each
constexpr int kKeyTiles = kTile / 8;  // 8-column tiles of a 16 x 64 block of scores
constexpr int kMaxHeads = 1024;
constexpr int kMaxSeq = 65536;
constexpr int kHeadMaxSeq = 128;  // the longest sequence whose backward runs a block per head

template <class T, int D>
struct Config {
  static constexpr int kLd = D + 8;  // T per tile row: 16-byte rows 4 banks apart
  static constexpr int kTileElements = kTile * kLd;
  static constexpr size_t kTileBytes = sizeof(T) * kTileElements;
  static constexpr int kDimTiles = D / 8;  // 8-column tiles of O, dQ, dK, dV
  static constexpr size_t kRowBytes = sizeof(float) * kTile;
  // Forward: Q, then two stages of (K, V).
  static constexpr size_t kForwardBytes = 5 * kTileBytes;
  // dQ kernel: Q, dO, two stages of (K, V), lse and D per query.
  static constexpr size_t kQueryBytes = 6 * kTileBytes + 2 * kRowBytes;
  // dK/dV kernel: K, V, two stages of (Q, dO), two stages of lse and D per query.
  static constexpr size_t kKeyBytes = 6 * kTileBytes + 4 * kRowBytes;
  // 4 forward blocks an SM (128 registers a thread) where D <= 64: at BERT-base (64 x 12 x 128 x 64,
  // dropout 0.1; H100, fp16, CUPTI kernel time in one `fusekit bench` process per variant) 36.1 us
  // a call against 39.3 us with 3 blocks and Q's fragments kept in registers (147 registers).
  // Blocks of 8 warps and 128 queries (2 an SM), which read each K and V tile once for twice the
  // queries, were tried and dropped: 37.8 against 36.2 us (without dropout 32.4 against 30.3 us);
  // at 32 x 12 x 512 x 64 without dropout 113.0 against 115.5 us.
  static constexpr int kForwardBlocksPerSm = D == 128 ? 2 : 4;
  // The backward kernels hold the scores and their gradients a few 8-column tiles at a time (kKeys
  // 8-key tiles of S and dP in the dQ kernel, kQueries 8-query tiles of S^T and dP^T in the dK/dV
  // kernel), so that 4 blocks an SM fit where D <= 64 (128 registers; ptxas spills 12 and 16
  // bytes). At BERT-base with dropout 0.1: dQ 56.5 us a call against 72.4 us with 2 blocks and
  // all 8 tiles at once (208 registers), dK/dV 59.8 against 63.3 us (2 blocks, 8 tiles, 242
  // registers). At D = 128 the dK and dV accumulators alone take 128 registers: 2 blocks, and the
  // dK/dV kernel takes half a query tile at a time to keep from spilling.
  static constexpr int kBackwardBlocksPerSm = D == 128 ? 2 : 4;
  static constexpr int kKeys = D == 128 ? 8 : 4;
  static constexpr int kQueries = D == 128 ? 4 : 2;
  static_assert(D % 16 == 0 && kTileBytes % 128 == 0, "layout");
  static_assert(kTile * (D / 8) % kThreads == 0, "whole passes of the row-dot loop");
  static_assert(kKeyBytes <= 227 * 1024 && kQueryBytes <= 227 * 1024, "shared memory of one block on sm_90");
};

// A call's dropout with its Philox round keys, which the kernels read as parameters (from the
// constant bank) instead of bumping the key in registers every round.
struct KeyedDropout : DropoutStream {
  PhiloxKeys keys;
};

KeyedDropout keyed_dropout(const BertAttentionDropout& d) {
  return {dropout_stream(d.p, d.seed, d.offset), philox_keys(d.seed)};
}

// ---- CUDA kernels

// Rows [0, count) of a [count, D] matrix whose rows lie `stride` elements apart in global memory,
// into a tile of ROWS rows (cp.async, 16 bytes a copy) by a block of THREADS; rows from count on are
// zeroed with plain stores. The caller commits the group.
template <class T, int D, int ROWS = kTile, int THREADS = kThreads>
__device__ __forceinline__ void copy_rows_async(T* tile, const T* __restrict__ source, size_t stride, int count) {
  constexpr int kVecs = D / 8;
  for (int e = threadIdx.x; e < ROWS * kVecs; e += THREADS) {
    const int r = e / kVecs, c = e % kVecs * 8;
    T* to = tile + r * Config<T, D>::kLd + c;
    if (r < count)
      copy_async16(to, source + r * stride + c);
    else
      *reinterpret_cast<int4*>(to) = make_int4(0, 0, 0, 0);
  }
}

// The fragment loaders take shared addresses: a tile's address plus a per-lane byte offset
// (Fragments::*_lane) plus the block's offset, a constant in the unrolled loops, so ptxas folds it
// into the instruction and keeps no address per block in registers.
#ifdef FUSEKIT_BERT_PAIR_LOADS
__device__ __forceinline__ uint32_t load_shared32(uint32_t address) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(address));
  return v;
}

__device__ __forceinline__ uint32_t load_shared16(uint32_t address) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(address));
  return v;
}
#endif

template <class T, int D>
struct Fragments {
  static constexpr int kRowBytes = sizeof(T) * Config<T, D>::kLd;
  static_assert(sizeof(T) == 2, "16-bit elements");
#ifdef FUSEKIT_BERT_PAIR_LOADS
  static __device__ __forceinline__ uint32_t a_lane(int lane) { return lane / 4 * kRowBytes + 4 * (lane % 4); }
  static __device__ __forceinline__ uint32_t b_rows_lane(int lane) { return a_lane(lane); }
  static __device__ __forceinline__ uint32_t b_columns_lane(int lane) {
    return 2 * (lane % 4) * kRowBytes + 2 * (lane / 4);
  }
  // A fragment of a row-major 16 x 16 block.
  static __device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t address) {
    a[0] = load_shared32(address);
    a[1] = load_shared32(address + 8 * kRowBytes);
    a[2] = load_shared32(address + 16);
    a[3] = load_shared32(address + 8 * kRowBytes + 16);
  }
  // B fragments of B = X^T for the 16 x 16 block of X stored [n][k]: b[0], b[1] for n rows 0..7,
  // b[2], b[3] for n rows 8..15.
  static __device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], uint32_t address) {
    b[0] = load_shared32(address);
    b[1] = load_shared32(address + 16);
    b[2] = load_shared32(address + 8 * kRowBytes);
    b[3] = load_shared32(address + 8 * kRowBytes + 16);
  }
  // B fragments of the 16 x 16 block of Y stored [k][n]: b[0], b[1] for n columns 0..7, b[2], b[3]
  // for n columns 8..15.
  static __device__ __forceinline__ void load_b_columns(uint32_t (&b)[4], uint32_t address) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t at = address + (i & 1) * 8 * kRowBytes + (i >> 1) * 16;
      b[i] = load_shared16(at) | load_shared16(at + kRowBytes) << 16;
    }
  }
#else
  // ldmatrix: lane L addresses row L % 8 of matrix L / 8 (mma_fragments.cuh).
  static __device__ __forceinline__ uint32_t a_lane(int lane) {
    return lane % 16 * kRowBytes + lane / 16 * 16;  // matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15)
  }
  static __device__ __forceinline__ uint32_t b_rows_lane(int lane) {
    return (lane % 8 + lane / 16 * 8) * kRowBytes + (lane / 8 & 1) * 16;  // (n 0-7 | 8-15) x (k 0-7 | 8-15)
  }
  static __device__ __forceinline__ uint32_t b_columns_lane(int lane) {
    return lane % 16 * kRowBytes + lane / 16 * 16;  // (n 0-7 | 8-15) x (k 0-7 | 8-15), transposed
  }
  static __device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t address) { load_matrix_x4(a, address); }
  static __device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], uint32_t address) { load_matrix_x4(b, address); }
  static __device__ __forceinline__ void load_b_columns(uint32_t (&b)[4], uint32_t address) {
    load_matrix_x4_transposed(b, address);
  }
#endif
};

// s[n] = A X^T for rows 8n .. 8n + 7 of x (keys, or queries), n < N: A the warp's 16 rows from
// `row` of tile a.
template <class T, int D, int N = kKeyTiles>
__device__ __forceinline__ void tile_scores(float (&s)[N][4], const T* a, int row, const T* x, int lane) {
  using F = Fragments<T, D>;
  const uint32_t a_base = shared_address(a) + F::a_lane(lane) + row * F::kRowBytes;
  const uint32_t x_base = shared_address(x) + F::b_rows_lane(lane);
#pragma unroll
  for (int n = 0; n < N; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t frag[4];
    F::load_a(frag, a_base + 32 * kc);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      uint32_t b[4];
      F::load_b_rows(b, x_base + 8 * n * F::kRowBytes + 32 * kc);
      mma_16816<T>(s[n], frag, b[0], b[1]);
      mma_16816<T>(s[n + 1], frag, b[2], b[3]);
    }
  }
}

// acc[n] += X Y: X the warp's 16 x 8N block in accumulator layout (x[j]: columns 8j .. 8j + 7),
// rounded to T as the A fragments of N / 2 16-wide k steps; Y rows 0 .. 8N - 1 of y (k = row).
template <class T, int D, int N = kKeyTiles>
__device__ __forceinline__ void fragments_times_tile(float (&acc)[D / 8][4], const float (&x)[N][4], const T* y,
                                                     int lane) {
  using F = Fragments<T, D>;
  const uint32_t y_base = shared_address(y) + F::b_columns_lane(lane);
#pragma unroll
  for (int kc = 0; kc < N / 2; ++kc) {
    const uint32_t frag[4] = {pack_pair<T>(x[2 * kc][0], x[2 * kc][1]), pack_pair<T>(x[2 * kc][2], x[2 * kc][3]),
                              pack_pair<T>(x[2 * kc + 1][0], x[2 * kc + 1][1]),
                              pack_pair<T>(x[2 * kc + 1][2], x[2 * kc + 1][3])};
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b[4];
      F::load_b_columns(b, y_base + 16 * kc * F::kRowBytes + 16 * n);
      mma_16816<T>(acc[n], frag, b[0], b[1]);
      mma_16816<T>(acc[n + 1], frag, b[2], b[3]);
    }
  }
}

// Writes acc (the warp's rows first_row + g and + 8 of a matrix, times factor0 and factor1) to rows
// `stride` elements apart; rows >= rows are not written.
template <class T, int D>
__device__ __forceinline__ void store_fragments(const float (&acc)[D / 8][4], T* destination, size_t stride,
                                                int first_row, int rows, float factor0, float factor1, int lane) {
  const int r0 = first_row + lane / 4, r1 = r0 + 8, t = lane % 4;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int col = 8 * n + 2 * t;
    if (r0 < rows)
      *reinterpret_cast<uint32_t*>(destination + r0 * stride + col) =
          pack_pair<T>(factor0 * acc[n][0], factor0 * acc[n][1]);
    if (r1 < rows)
      *reinterpret_cast<uint32_t*>(destination + r1 * stride + col) =
          pack_pair<T>(factor1 * acc[n][2], factor1 * acc[n][3]);
  }
}

// Dropout flags of a thread's 16 x 64 block of (query row, key column) fragments. element0 and
// element1: stream indices of key 0 of the tile in rows g and g + 8. The quad's 16 (row, 8-key
// tile) pairs are drawn once each, 8 flags a Philox call: lane 4g + t draws row g (t even) or g + 8
// (t odd), tiles n = t / 2 + 2m as byte m. Row g's even tiles are then lane 4g's bytes and its odd
// tiles lane 4g + 2's, row g + 8's lanes 4g + 1 and 4g + 3, and bits 2t, 2t + 1 of each byte are this
// lane's keys. Returns in row0 / row1 the flags of rows g / g + 8: bit 4n + x is key 8n + 2t + x
// (x = 0, 1).
__device__ __forceinline__ void row_dropout_bits(const KeyedDropout& dropout, uint64_t element0, uint64_t element1,
                                                 int lane, uint32_t& row0, uint32_t& row1) {
  const int t = lane % 4;
  const uint64_t first = (t & 1 ? element1 : element0) + 8 * (t >> 1);
  uint32_t drawn = 0;
#pragma unroll
  for (int m = 0; m < kKeyTiles / 2; ++m)
    drawn |= dropout_kept_bits8(dropout.keys, dropout.offset, first + 16 * m, dropout.threshold) << (8 * m);
  const int quad = lane & ~3;
  const uint32_t even0 = __shfl_sync(0xffffffffu, drawn, quad) >> (2 * t);
  const uint32_t even1 = __shfl_sync(0xffffffffu, drawn, quad | 1) >> (2 * t);
  const uint32_t odd0 = __shfl_sync(0xffffffffu, drawn, quad | 2) >> (2 * t);
  const uint32_t odd1 = __shfl_sync(0xffffffffu, drawn, quad | 3) >> (2 * t);
  row0 = (even0 & 0x03030303u) | (odd0 & 0x03030303u) << 4;
  row1 = (even1 & 0x03030303u) | (odd1 & 0x03030303u) << 4;
}

// Dropout flags of a thread's 16 x 64 block of (key row, query column) fragments in the dK/dV
// kernel. element: stream index of (query 2t + (g & 1) of the tile, key 8 (g / 2 % 2) of the warp's
// 16). The 8 lanes of one t hold the same 16 queries, 8j + 2t + x (x = 0, 1); they draw their 32
// (query, 8-key half) pairs once each, 8 flags a Philox call: lane 4g + t draws x = g % 2, the half
// g / 2 % 2 and j = 4 (g / 4) + k as byte k. So element e's flags (keys g, g, g + 8, g + 8; queries
// 8j + 2t, + 1, 8j + 2t, + 1) are bit g of the bytes of lanes 4e + t (j < 4) and 4e + 16 + t (j >= 4).
// kept[e] holds tile j's flag as bit kept_bit(j).
__device__ __forceinline__ int kept_bit(int j) { return 8 * (j % 4) + 4 * (j / 4); }

__device__ __forceinline__ void column_dropout_bits(const KeyedDropout& dropout, uint64_t element, uint64_t seq,
                                                    int lane, uint32_t (&kept)[4]) {
  const int g = lane / 4, t = lane % 4;
  const uint64_t first = element + 32 * static_cast<uint64_t>(g / 4) * seq;
  uint32_t drawn = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    drawn |= dropout_kept_bits8(dropout.keys, dropout.offset, first + 8 * k * seq, dropout.threshold) << (8 * k);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t low = __shfl_sync(0xffffffffu, drawn, 4 * e + t) >> g;
    const uint32_t high = __shfl_sync(0xffffffffu, drawn, 4 * e + 16 + t) >> g;
    kept[e] = (low & 0x01010101u) | (high & 0x01010101u) << 4;
  }
}

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

// The backward of a whole head in one block, for seq <= 16 WARPS and head_dim <= 64: WARPS warps per
// (sequence, head), warp w owning keys 16w .. 16w + 15 as rows (as the dK/dV kernel) and, after a
// barrier, queries 16w .. 16w + 15 for dQ. Every key and query of the head is in shared memory, so
// the scores are computed once (not once per kernel), D = rowsum(dO * O) needs no workspace, and
// dQ = scale dS K is summed over every key inside the block: no atomics, deterministic. The warps
// write dS^T (rounded to T, as the dQ kernel rounds dS for its products) to shared memory while
// they sum dK and dV, and read it back as the left operand of dQ (ldmatrix.trans). At BERT-base
// (64 x 12 x 128 x 64, dropout 0.1; H100, fp16, CUPTI kernel time in one `fusekit bench` process
// with SDPA): 80.3 us a call, against 116.1 us for the dQ and dK/dV kernels (56.6 + 59.5 in the
// suite at 961457e) and 102.5 us for cuDNN's backward kernels (67.5 + the dot(dO, O), dQ
// conversion and unpack kernels' 35.0).
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

// The forward takes the running max of the raw scores and scales it, which needs scale > 0; a
// subnormal scale would flush to 0 in the kernels (-inf * 0 = NaN for masked keys).
void check_scale(float scale) {
  if (!(scale >= std::numeric_limits<float>::min() && std::isfinite(scale)))
    throw std::invalid_argument("bert_attention: scale must be a positive normal finite float, got " +
                                std::to_string(scale));
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
  check_scale(scale);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  if (s.batch == 0) return;
  const KeyedDropout stream_of_dropout = keyed_dropout(dropout);
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
  check_scale(scale);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  check_aligned(dout, "dout");
  check_aligned(dqkv, "dqkv");
  if (s.batch == 0) return;
  const KeyedDropout stream_of_dropout = keyed_dropout(dropout);
  const int blocks = s.batch * s.heads * ceil_div(s.seq, kTile);
  float* row_dots = static_cast<float*>(workspace);
  dispatch(dtype, s.head_dim, [&](auto type, auto d) {
    using T = typename decltype(type)::type;
    constexpr int D = decltype(d)::value;
    using C = Config<T, D>;
    if constexpr (D <= 64) {
      if (s.seq <= kHeadMaxSeq) {  // the whole head in one block
        auto launch = [&](auto warps) {
          constexpr int W = decltype(warps)::value;
          using H = HeadConfig<T, D, W>;
          allow_shared<bert_attention_head_backward_kernel<T, D, W>>(H::kBytes);
          bert_attention_head_backward_kernel<T, D, W><<<s.batch * s.heads, H::kThreads, H::kBytes, stream>>>(
              static_cast<const T*>(qkv), valid_lengths, static_cast<const T*>(out), lse, static_cast<const T*>(dout),
              static_cast<T*>(dqkv), s.heads, s.seq, scale, stream_of_dropout);
          FUSEKIT_CUDA_CHECK(cudaGetLastError());
        };
        if (s.seq <= kHeadMaxSeq / 2)
          launch(std::integral_constant<int, kHeadMaxSeq / 32>{});
        else
          launch(std::integral_constant<int, kHeadMaxSeq / 16>{});
        return;
      }
    }
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
