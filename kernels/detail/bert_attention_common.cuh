// BERT attention: what the forward and backward kernels share. The tile sizes and per-head-dim
// shared-memory layouts (Config), the call's keyed Philox stream, the cp.async tile copies, the
// ldmatrix fragment loaders and the tile products on mma.sync fragments, and the dropout flags of a
// warp's rows and columns.
#pragma once

#include <cstdint>

#include "kernels/bert_attention.h"
#include "kernels/common.cuh"
#include "kernels/detail/mma_fragments.cuh"
#include "kernels/detail/philox.cuh"

namespace fusekit::kernels {
// Included by bert_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
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
  // 4 forward blocks an SM (128 registers a thread) where D <= 64: faster than 3 blocks with Q's
  // fragments kept in registers (147 registers), and than blocks of 8 warps and 128 queries.
  static constexpr int kForwardBlocksPerSm = D == 128 ? 2 : 4;
  // The backward kernels hold the scores and their gradients a few 8-column tiles at a time (kKeys
  // 8-key tiles of S and dP in the dQ kernel, kQueries 8-query tiles of S^T and dP^T in the dK/dV
  // kernel), so that 4 blocks an SM fit where D <= 64 (128 registers; ptxas spills 12 and 16 bytes),
  // which measured faster than 2 blocks holding all 8 tiles at once. At D = 128 the dK and dV
  // accumulators alone take 128 registers: 2 blocks, and the dK/dV kernel takes half a query tile at
  // a time to keep from spilling.
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
  return {dropout_stream(d.p, d.seed, d.offset, d.counter), philox_keys(d.seed)};
}

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
template <class T, int D>
struct Fragments {
  static constexpr int kRowBytes = sizeof(T) * Config<T, D>::kLd;
  static_assert(sizeof(T) == 2, "16-bit elements");
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
    drawn |= dropout_kept_bits8(dropout.keys, dropout.offset_now(), first + 16 * m, dropout.threshold) << (8 * m);
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
    drawn |= dropout_kept_bits8(dropout.keys, dropout.offset_now(), first + 8 * k * seq, dropout.threshold) << (8 * k);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t low = __shfl_sync(0xffffffffu, drawn, 4 * e + t) >> g;
    const uint32_t high = __shfl_sync(0xffffffffu, drawn, 4 * e + 16 + t) >> g;
    kept[e] = (low & 0x01010101u) | (high & 0x01010101u) << 4;
  }
}

}  // namespace
}  // namespace fusekit::kernels
