// Swin window attention forward and backward (see window_attention.h for the math and layouts).
// 49-token windows take the register-fragment kernels further down ("49-token windows"); what
// follows describes the shared-memory kernels, which serve 144-token windows.
//
// Design: a block per (window, head), 128 threads for 49 tokens and 256 for 144. Q, K, V (and dO in
// the backward) of the window sit in shared memory as [padded tokens][head_dim + 8] tiles of T, rows
// past the window's tokens zero. The products run on tensor cores through nvcuda::wmma with
// 16x16x16 fragments and fp32 accumulators (kernels/attention_tiles.cuh: every fragment goes
// through shared memory, so nothing depends on the fragments' register layout).
// Scores S (and dP) are float [padded][padded + 8]; P (and dS) are T [padded][padded + 8]. The row
// pitches are multiples of 8 elements of T / 4 floats as wmma requires, padded past the tile width
// so that rows do not start on the same bank; every tile starts 32-byte aligned. The forward's
// softmax reads S with 8 (49 tokens) or 16 (144) lanes per row, keys in registers, in float.
// Outputs leave a warp's accumulator through a 16x16 float staging tile, 8 elements (16 bytes) per
// lane, straight into the packed [tokens, 3, heads, head_dim] or [tokens, heads * head_dim] rows.
//
// The backward's blocks stay resident: block (slice, head) loops over windows slice, slice +
// slices, ... of its head and keeps the sum of their dS in its own float slice of the workspace
// (the first window stores, later ones add: no other block touches the slice, so no atomics).
// Two small kernels then sum the slices (window_bias_reduce_kernel) and fold [heads, N, N] into the
// table through the index (window_table_gradient_kernel: a warp per table entry, a lane per head).
#include <mma.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_tiles.cuh"
#include "kernels/common.cuh"
#include "kernels/mma_fragments.cuh"
#include "kernels/window_attention.h"

namespace fusekit::kernels {
namespace {

using namespace nvcuda;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxHeads = 64;  // the table gradient's warp holds two heads per lane

// Sizes and the shared-memory layout of a (T, tokens, head dim) instantiation. Every region is a
// multiple of 32 bytes, so every region and every 16-row or 16-column tile in it is 32-byte aligned.
template <class T, int N, int D>
struct Config {
  static constexpr int kPadded = (N + 15) / 16 * 16;  // 49 -> 64, 144 -> 144
  static constexpr int kThreads = kPadded <= 64 ? 128 : 256;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kTiles = kPadded / 16;  // 16-token tiles
  static constexpr int kDimTiles = D / 16;     // 16-column tiles of the head dimension
  static constexpr int kLdTile = D + 8;        // T per row of Q, K, V, dO
  // floats per row of S, dP: + 8, so that the 4 rows one warp's softmax reads at once (8 lanes
  // each) fall on distinct banks
  static constexpr int kLdScores = kPadded + 8;
  static constexpr int kLdProbs = kPadded + 8;              // T per row of P, dS
  static constexpr int kRowLanes = kPadded <= 64 ? 8 : 16;  // lanes per row in the forward's softmax
  static constexpr int kPerLane = kPadded / kRowLanes;      // keys per lane there: 8 or 9
  static constexpr size_t kTileBytes = sizeof(T) * kPadded * kLdTile;
  static constexpr size_t kScoresBytes = sizeof(float) * kPadded * kLdScores;
  static constexpr size_t kProbsBytes = sizeof(T) * kPadded * kLdProbs;
  static constexpr size_t kStageBytes = sizeof(float) * 256 * kWarps;  // a 16x16 float tile per warp
  static constexpr size_t kRowBytes = sizeof(float) * kPadded;
  // Forward: Q, K, V, S (its rows then stage the output), P.
  static constexpr size_t kForwardBytes = 3 * kTileBytes + kScoresBytes + kProbsBytes;
  // Backward: Q, K, V, dO, S then dP, P then dS, staging, lse and D per row.
  static constexpr size_t kBackwardBytes = 4 * kTileBytes + kScoresBytes + kProbsBytes + kStageBytes + 2 * kRowBytes;
  static_assert(D % 16 == 0 && kStageBytes <= kScoresBytes, "layout");
  static_assert(kPerLane * kRowLanes == kPadded && kThreads / kRowLanes == 16, "16 softmax rows per pass");
  static_assert(kBackwardBytes <= 227 * 1024, "shared memory of one block on sm_90");
};

// ---- CUDA kernels

// Rows [0, N) of a [N, D] matrix whose rows lie `stride` elements apart in global memory, into a
// tile of kPadded rows of kLdTile; rows past N are zero. 16-byte accesses.
template <class T, int N, int D>
__device__ __forceinline__ void load_tile(T* tile, const T* __restrict__ source, size_t stride) {
  using C = Config<T, N, D>;
  constexpr int kVecs = D / 8;
  for (int e = threadIdx.x; e < C::kPadded * kVecs; e += C::kThreads) {
    const int r = e / kVecs, c = e % kVecs * 8;
    int4 value = make_int4(0, 0, 0, 0);
    if (r < N) value = __ldg(reinterpret_cast<const int4*>(source + r * stride + c));
    *reinterpret_cast<int4*>(tile + r * C::kLdTile + c) = value;
  }
}

// S = Q K^T into `scores`: the warps share the kTiles^2 tiles.
template <class T, int N, int D>
__device__ __forceinline__ void scores_product(const T* q, const T* k, float* scores) {
  using C = Config<T, N, D>;
  const int warp = threadIdx.x / kWarpSize;
  for (int t = warp; t < C::kTiles * C::kTiles; t += C::kWarps) {
    const int ti = t / C::kTiles, tj = t % C::kTiles;
    Accumulator acc;
    // A = Q rows ti (row_major), B = K^T columns tj: K's rows read col_major.
    multiply_tiles<T, wmma::row_major, wmma::col_major>(acc, q + ti * 16 * C::kLdTile, C::kLdTile, 16,
                                                        k + tj * 16 * C::kLdTile, C::kLdTile, 16, C::kDimTiles);
    wmma::store_matrix_sync(scores + ti * 16 * C::kLdScores + tj * 16, acc, C::kLdScores, wmma::mem_row_major);
  }
}

// Writes the warp's 16x16 accumulator tile, times `factor`, to rows first_row.. of `destination`
// (rows `stride` elements apart; rows >= N are not written), through the warp's staging tile.
template <class T, int N>
__device__ __forceinline__ void store_rows(const Accumulator& acc, float* stage, T* destination, size_t stride,
                                           int first_row, float factor) {
  wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % kWarpSize;
  const int r = lane / 2, c = lane % 2 * 8;
  if (first_row + r < N) {
    Vec<T, 8> out;
#pragma unroll
    for (int k = 0; k < 8; ++k) out.v[k] = from_float<T>(factor * stage[r * 16 + c + k]);
    out.store(destination + (first_row + r) * stride + c);
  }
  __syncwarp();  // the staging tile is rewritten by the warp's next tile
}

// The gathered bias: bias[h, i, j] = table[index[i, j], h], one thread per element.
template <class T>
__global__ void window_bias_gather_kernel(const T* __restrict__ table, const int32_t* __restrict__ index,
                                          float* __restrict__ bias, int heads, int pairs) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= heads * pairs) return;
  const int h = e / pairs, ij = e % pairs;
  bias[e] = to_float(table[static_cast<size_t>(index[ij]) * heads + h]);
}

template <class T, int N, int D>
__global__ void __launch_bounds__(Config<T, N, D>::kThreads)
    window_attention_forward_kernel(const T* __restrict__ qkv, const float* __restrict__ bias,
                                    const float* __restrict__ mask, T* __restrict__ out, float* __restrict__ lse,
                                    int heads, int mask_windows, float scale) {
  using C = Config<T, N, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q = reinterpret_cast<T*>(shared);
  T* k = reinterpret_cast<T*>(shared + C::kTileBytes);
  T* v = reinterpret_cast<T*>(shared + 2 * C::kTileBytes);
  float* scores = reinterpret_cast<float*>(shared + 3 * C::kTileBytes);
  T* probs = reinterpret_cast<T*>(shared + 3 * C::kTileBytes + C::kScoresBytes);
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int warp = threadIdx.x / kWarpSize;

  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D;  // elements from one token's row to the next
  const T* source = qkv + static_cast<size_t>(b) * N * qkv_stride + h * D;
  load_tile<T, N, D>(q, source, qkv_stride);
  load_tile<T, N, D>(k, source + heads * D, qkv_stride);
  load_tile<T, N, D>(v, source + 2 * heads * D, qkv_stride);
  __syncthreads();
  scores_product<T, N, D>(q, k, scores);
  __syncthreads();

  // Softmax, a group of kRowLanes lanes per row (16 rows per pass, as in softmax.cu): lane g of the
  // group holds keys g, g + kRowLanes, ...; padded keys and padded rows come out 0 in P. Every thread
  // runs every pass (kPadded / 16 of them), so the groups' shuffles see whole warps.
  const float* bias_h = bias + static_cast<size_t>(h) * N * N;
  const float* mask_w = mask ? mask + static_cast<size_t>(b % mask_windows) * N * N : nullptr;
  const int g = threadIdx.x % C::kRowLanes;
  for (int i = threadIdx.x / C::kRowLanes; i < C::kPadded; i += C::kThreads / C::kRowLanes) {
    float z[C::kPerLane];
    float high = -INFINITY;
#pragma unroll
    for (int r = 0; r < C::kPerLane; ++r) {
      const int j = g + r * C::kRowLanes;
      z[r] = -INFINITY;
      if (i < N && j < N) {
        z[r] = scale * scores[i * C::kLdScores + j] + bias_h[i * N + j];
        if (mask_w) z[r] += mask_w[i * N + j];
      }
      high = fmaxf(high, z[r]);
    }
    high = lane_group_max<C::kRowLanes>(high);
    const float shift = high == -INFINITY ? 0.f : high;  // a row with no key (or a padded row) writes zeros
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < C::kPerLane; ++r) {
      z[r] = exp2f((z[r] - shift) * kLog2e);
      sum += z[r];
    }
    sum = lane_group_sum<C::kRowLanes>(sum);
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;
    T* p_row = probs + i * C::kLdProbs;
#pragma unroll
    for (int r = 0; r < C::kPerLane; ++r) p_row[g + r * C::kRowLanes] = from_float<T>(z[r] * inverse);
    // +inf for a row with no key: the backward's exp(S - lse) is then 0 there.
    if (g == 0 && i < N) lse[(static_cast<size_t>(b) * heads + h) * N + i] = sum > 0.f ? shift + logf(sum) : INFINITY;
  }
  __syncthreads();

  // O = P V; the score rows are free now and stage the output tiles.
  float* stage = scores + warp * 256;
  const size_t out_stride = static_cast<size_t>(heads) * D;
  T* destination = out + static_cast<size_t>(b) * N * out_stride + h * D;
  for (int t = warp; t < C::kTiles * C::kDimTiles; t += C::kWarps) {
    const int ti = t / C::kDimTiles, tn = t % C::kDimTiles;
    Accumulator acc;
    multiply_tiles<T, wmma::row_major, wmma::row_major>(acc, probs + ti * 16 * C::kLdProbs, C::kLdProbs, 16,
                                                        v + tn * 16, C::kLdTile, 16 * C::kLdTile, C::kTiles);
    store_rows<T, N>(acc, stage, destination + tn * 16, out_stride, ti * 16, 1.f);
  }
}

template <class T, int N, int D>
__global__ void __launch_bounds__(Config<T, N, D>::kThreads, 1)
    window_attention_backward_kernel(const T* __restrict__ qkv, const float* __restrict__ bias,
                                     const float* __restrict__ mask, const T* __restrict__ out,
                                     const float* __restrict__ lse, const T* __restrict__ dout, T* __restrict__ dqkv,
                                     float* __restrict__ partials, int windows, int heads, int mask_windows, int slices,
                                     float scale) {
  using C = Config<T, N, D>;
  extern __shared__ __align__(128) unsigned char shared[];
  T* q = reinterpret_cast<T*>(shared);
  T* k = reinterpret_cast<T*>(shared + C::kTileBytes);
  T* v = reinterpret_cast<T*>(shared + 2 * C::kTileBytes);
  T* dout_tile = reinterpret_cast<T*>(shared + 3 * C::kTileBytes);
  float* scores = reinterpret_cast<float*>(shared + 4 * C::kTileBytes);           // S, then dP
  T* probs = reinterpret_cast<T*>(shared + 4 * C::kTileBytes + C::kScoresBytes);  // P, then dS
  float* stages = reinterpret_cast<float*>(shared + 4 * C::kTileBytes + C::kScoresBytes + C::kProbsBytes);
  float* row_lse = stages + C::kStageBytes / sizeof(float);
  float* row_d = row_lse + C::kPadded;

  const int h = blockIdx.x % heads, slice = blockIdx.x / heads;
  const int warp = threadIdx.x / kWarpSize;
  float* stage = stages + warp * 256;
  float* partial = partials + (static_cast<size_t>(slice) * heads + h) * N * N;
  const float* bias_h = bias + static_cast<size_t>(h) * N * N;
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;

  for (int b = slice; b < windows; b += slices) {
    const bool first = b == slice;
    const T* source = qkv + static_cast<size_t>(b) * N * qkv_stride + h * D;
    load_tile<T, N, D>(q, source, qkv_stride);
    load_tile<T, N, D>(k, source + heads * D, qkv_stride);
    load_tile<T, N, D>(v, source + 2 * heads * D, qkv_stride);
    // dO into its tile, and D_i = dO_i . O_i: a group of D / 8 lanes per row, 8 elements each. Every
    // thread runs every iteration (the groups' shuffles need whole warps).
    {
      constexpr int kVecs = D / 8;
      constexpr int kSlots = (C::kPadded * kVecs + C::kThreads - 1) / C::kThreads * C::kThreads;
      const T* o_rows = out + static_cast<size_t>(b) * N * out_stride + h * D;
      const T* g_rows = dout + static_cast<size_t>(b) * N * out_stride + h * D;
      for (int e = threadIdx.x; e < kSlots; e += C::kThreads) {
        const int r = e / kVecs, c = e % kVecs * 8;
        Vec<T, 8> g;
        float dot = 0.f;
        if (r < N) {
          const Vec<T, 8> o = Vec<T, 8>::load(o_rows + r * out_stride + c);
          g = Vec<T, 8>::load(g_rows + r * out_stride + c);
#pragma unroll
          for (int x = 0; x < 8; ++x) dot += to_float(o.v[x]) * to_float(g.v[x]);
        } else {
#pragma unroll
          for (int x = 0; x < 8; ++x) g.v[x] = from_float<T>(0.f);
        }
        dot = lane_group_sum<kVecs>(dot);
        if (r < C::kPadded) {
          g.store(dout_tile + r * C::kLdTile + c);
          if (c == 0) row_d[r] = dot;
        }
      }
    }
    for (int i = threadIdx.x; i < C::kPadded; i += C::kThreads) {
      row_lse[i] = i < N ? lse[(static_cast<size_t>(b) * heads + h) * N + i] : INFINITY;
    }
    __syncthreads();
    scores_product<T, N, D>(q, k, scores);
    __syncthreads();

    // P = exp(S - lse), recomputed in float from the saved log-sum-exp; 0 outside the window.
    const float* mask_w = mask ? mask + static_cast<size_t>(b % mask_windows) * N * N : nullptr;
    for (int e = threadIdx.x; e < C::kPadded * C::kPadded; e += C::kThreads) {
      const int i = e / C::kPadded, j = e % C::kPadded;
      float p = 0.f;
      if (i < N && j < N) {
        float z = scale * scores[i * C::kLdScores + j] + bias_h[i * N + j];
        if (mask_w) z += mask_w[i * N + j];
        p = exp2f((z - row_lse[i]) * kLog2e);
      }
      probs[i * C::kLdProbs + j] = from_float<T>(p);
    }
    __syncthreads();

    // dV = P^T dO (out to dqkv), and dP = dO V^T (into the score rows, no longer needed).
    T* dq_rows = dqkv + static_cast<size_t>(b) * N * qkv_stride + h * D;
    constexpr int kOutTiles = C::kTiles * C::kDimTiles;
    for (int t = warp; t < kOutTiles + C::kTiles * C::kTiles; t += C::kWarps) {
      Accumulator acc;
      if (t < kOutTiles) {
        const int ti = t / C::kDimTiles, tn = t % C::kDimTiles;
        // A = P^T: P's columns ti read col_major, stepping down P's rows; B = dO rows, row_major.
        multiply_tiles<T, wmma::col_major, wmma::row_major>(acc, probs + ti * 16, C::kLdProbs, 16 * C::kLdProbs,
                                                            dout_tile + tn * 16, C::kLdTile, 16 * C::kLdTile,
                                                            C::kTiles);
        store_rows<T, N>(acc, stage, dq_rows + 2 * heads * D + tn * 16, qkv_stride, ti * 16, 1.f);
      } else {
        const int ti = (t - kOutTiles) / C::kTiles, tj = (t - kOutTiles) % C::kTiles;
        // A = dO rows ti, B = V^T: V's rows tj read col_major.
        multiply_tiles<T, wmma::row_major, wmma::col_major>(acc, dout_tile + ti * 16 * C::kLdTile, C::kLdTile, 16,
                                                            v + tj * 16 * C::kLdTile, C::kLdTile, 16, C::kDimTiles);
        wmma::store_matrix_sync(scores + ti * 16 * C::kLdScores + tj * 16, acc, C::kLdScores, wmma::mem_row_major);
      }
    }
    __syncthreads();

    // dS = P (dP - D) in place of P, in T for the products; in float into this block's slice of the
    // bias gradient (only this block reads or writes the slice).
    for (int e = threadIdx.x; e < C::kPadded * C::kPadded; e += C::kThreads) {
      const int i = e / C::kPadded, j = e % C::kPadded;
      float ds = 0.f;
      if (i < N && j < N) {
        ds = to_float(probs[i * C::kLdProbs + j]) * (scores[i * C::kLdScores + j] - row_d[i]);
        float* slot = partial + i * N + j;
        *slot = first ? ds : *slot + ds;
      }
      probs[i * C::kLdProbs + j] = from_float<T>(ds);
    }
    __syncthreads();

    // dQ = scale dS K and dK = scale dS^T Q.
    for (int t = warp; t < 2 * kOutTiles; t += C::kWarps) {
      const int ti = t % kOutTiles / C::kDimTiles, tn = t % kOutTiles % C::kDimTiles;
      Accumulator acc;
      if (t < kOutTiles) {
        multiply_tiles<T, wmma::row_major, wmma::row_major>(acc, probs + ti * 16 * C::kLdProbs, C::kLdProbs, 16,
                                                            k + tn * 16, C::kLdTile, 16 * C::kLdTile, C::kTiles);
        store_rows<T, N>(acc, stage, dq_rows + tn * 16, qkv_stride, ti * 16, scale);
      } else {
        // A = dS^T: dS's columns ti read col_major.
        multiply_tiles<T, wmma::col_major, wmma::row_major>(acc, probs + ti * 16, C::kLdProbs, 16 * C::kLdProbs,
                                                            q + tn * 16, C::kLdTile, 16 * C::kLdTile, C::kTiles);
        store_rows<T, N>(acc, stage, dq_rows + heads * D + tn * 16, qkv_stride, ti * 16, scale);
      }
    }
    __syncthreads();  // the next window overwrites the tiles
  }
}

// dbias[h, i, j] = sum over slices of partials[slice, h, i, j]: block (32 x kSliceGroups) threads
// for 32 consecutive elements; thread (x, y) sums the slices y, y + kSliceGroups, ... of element x,
// then row y = 0 adds the groups in order (deterministic; enough loads in flight for ~1000 slices).
constexpr int kSliceGroups = 8;
__global__ void __launch_bounds__(kWarpSize* kSliceGroups)
    window_bias_reduce_kernel(const float* __restrict__ partials, float* __restrict__ dbias, int count, int slices) {
  __shared__ float group_sums[kSliceGroups][kWarpSize];
  const int e = blockIdx.x * kWarpSize + threadIdx.x;
  float sum = 0.f;
  if (e < count) {
    for (int s = threadIdx.y; s < slices; s += kSliceGroups) sum += partials[static_cast<size_t>(s) * count + e];
  }
  group_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && e < count) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kSliceGroups; ++y) total += group_sums[y][threadIdx.x];
    dbias[e] = total;
  }
}

// dtable[t, h] = sum of dbias[h, i, j] over the (i, j) with index[i, j] = t: a warp per entry t
// finds the matching pairs 32 at a time (ballot) and each lane adds them up for heads lane and
// lane + 32, in pair order (deterministic).
template <class T>
__global__ void window_table_gradient_kernel(const float* __restrict__ dbias, const int32_t* __restrict__ index,
                                             T* __restrict__ dtable, int entries, int heads, int pairs) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (t >= entries) return;  // the whole warp
  float first = 0.f, second = 0.f;
  for (int base = 0; base < pairs; base += kWarpSize) {
    const int ij = base + lane;
    unsigned match = __ballot_sync(0xffffffffu, ij < pairs && index[ij] == t);
    while (match) {
      const int m = base + __ffs(match) - 1;
      match &= match - 1;
      if (lane < heads) first += dbias[static_cast<size_t>(lane) * pairs + m];
      if (lane + kWarpSize < heads) second += dbias[static_cast<size_t>(lane + kWarpSize) * pairs + m];
    }
  }
  if (lane < heads) dtable[static_cast<size_t>(t) * heads + lane] = from_float<T>(first);
  if (lane + kWarpSize < heads) dtable[static_cast<size_t>(t) * heads + lane + kWarpSize] = from_float<T>(second);
}

// ---- 49-token windows (window 7): scores in registers
//
// A block of 4 warps works through `chunk` windows of one head h and one mask window m (windows
// m, m + mask_windows, m + 2 mask_windows, ...), so the bias and mask it adds are the same for all
// of them: each thread loads its 28 values of bias + mask once and keeps them in registers, and no
// window reads the bias or the mask again. Warp w owns query rows 16w..16w+15 (the fourth warp holds
// one real row). S = Q K^T, the softmax and P stay in mma fragments (kernels/mma_fragments.cuh);
// P is the left operand of P V straight from the accumulators. Q, K, V (and dO) of the next window
// are copied into the other of two shared-memory stages (cp.async) while the current one is
// computed, so every block keeps a window's loads in flight. The backward takes D_i as
// rowsum(P * dP) over the registers (equal to dO_i . O_i, FlashAttention's identity), so it does
// not read O, and keeps its dS summed over its windows in registers for the bias-table gradient.

template <class T, int D>
struct SmallWindow {
  static constexpr int kN = 49;
  static constexpr int kThreads = 128;
  static constexpr int kRows = 64;                 // padded tokens: 4 warps x 16 query rows
  static constexpr int kKeyTiles = 7;              // 8-key tiles of S: keys 0..55
  static constexpr int kKeySteps = 4;              // 16-key steps of P V: keys 0..63
  static constexpr int kDimTiles = D / 8;          // 8-column tiles of O, dQ, dK, dV
  static constexpr int kDimSteps = D / 16;         // 16-wide steps of Q K^T and dO V^T
  static constexpr int kLd = D + 8;                // T per tile row: conflict-free fragment loads
  static constexpr int kLdTransposed = kRows + 8;  // T per row of P^T and dS^T
  static constexpr int kTile = kRows * kLd;        // T per tile
  static constexpr int kForwardTiles = 3;          // Q, K, V
  static constexpr int kBackwardTiles = 4;         // Q, K, V, dO
  static constexpr size_t kForwardBytes = 2 * kForwardTiles * sizeof(T) * kTile;
  static constexpr size_t kTransposedBytes = sizeof(T) * kRows * kLdTransposed;
  static constexpr size_t kBackwardBytes =
      2 * kBackwardTiles * sizeof(T) * kTile + 2 * kTransposedBytes + 2 * sizeof(float) * kRows;
  static constexpr int kForwardChunk = 8, kBackwardChunk = 16;  // windows per block
  static constexpr int kBackwardBlocksPerSm = D == 32 ? 3 : 2;
  static_assert(kKeyTiles * 8 >= kN && kKeySteps * 16 >= kKeyTiles * 8 && kRows >= kN, "tiling");
};

// How the windows are dealt to blocks: class c = h * mask_windows + m, `parts` blocks per class,
// block (c, part) takes the windows m + mask_windows k for k in [part chunk, (part + 1) chunk).
struct WindowDeal {
  int mask_windows;  // >= 1
  int per_class;     // windows / mask_windows
  int chunk;
  int parts;
  int blocks(int heads) const { return heads * mask_windows * parts; }
};

WindowDeal deal_windows(const WindowAttentionShape& s, int chunk) {
  WindowDeal d;
  d.mask_windows = std::max(s.mask_windows, 1);
  d.per_class = s.windows / d.mask_windows;
  d.chunk = std::max(1, std::min(chunk, d.per_class));
  d.parts = d.per_class > 0 ? ceil_div(d.per_class, d.chunk) : 0;
  return d;
}

// Rows [0, kN) of a tile from rows `stride` elements apart, asynchronously, 16 bytes per copy.
template <class T, int D>
__device__ __forceinline__ void copy_tile_async(T* tile, const T* __restrict__ source, size_t stride) {
  using C = SmallWindow<T, D>;
  constexpr int kVecs = D / 8;
  for (int e = threadIdx.x; e < C::kN * kVecs; e += C::kThreads) {
    const int r = e / kVecs, c = e % kVecs * 8;
    copy_async16(tile + r * C::kLd + c, source + r * stride + c);
  }
}

// Zeroes rows [kN, kRows) of `tiles` consecutive tiles: the padded rows the copies never write.
template <class T, int D>
__device__ __forceinline__ void zero_padding_rows(T* tiles, int count) {
  using C = SmallWindow<T, D>;
  constexpr int kPadVecs = (C::kRows - C::kN) * C::kLd / 8;
  for (int e = threadIdx.x; e < count * kPadVecs; e += C::kThreads) {
    const int tile = e / kPadVecs, x = e % kPadVecs;
    reinterpret_cast<int4*>(tiles + tile * C::kTile + C::kN * C::kLd)[x] = make_int4(0, 0, 0, 0);
  }
}

// This thread's bias + mask at its S positions, times log2 e: rows r0 (elements 0, 1) and r0 + 8
// (2, 3), keys 8j + 2t (+1); -inf outside the window, so padded keys and padded rows get P = 0.
template <int N, int KEY_TILES>
__device__ __forceinline__ void load_window_bias(float (&add)[KEY_TILES][4], const float* __restrict__ bias_h,
                                                 const float* __restrict__ mask_m, int r0, int t) {
#pragma unroll
  for (int j = 0; j < KEY_TILES; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e < 2 ? r0 : r0 + 8, c = 8 * j + 2 * t + (e & 1);
      float value = -INFINITY;
      if (r < N && c < N) {
        value = bias_h[r * N + c];
        if (mask_m) value += mask_m[r * N + c];
        value *= kLog2e;
      }
      add[j][e] = value;
    }
  }
}

// S = Q K^T for the warp's 16 rows (accumulators s[j] for keys 8j..8j+7).
template <class T, int D>
__device__ __forceinline__ void row_scores(float (&s)[SmallWindow<T, D>::kKeyTiles][4], const T* a, const T* b, int r0,
                                           int g, int t) {
  using C = SmallWindow<T, D>;
#pragma unroll
  for (int j = 0; j < C::kKeyTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < C::kDimSteps; ++kc) {
    const int col = 16 * kc + 2 * t;
    const uint32_t frag[4] = {load_pair(a + r0 * C::kLd + col), load_pair(a + (r0 + 8) * C::kLd + col),
                              load_pair(a + r0 * C::kLd + col + 8), load_pair(a + (r0 + 8) * C::kLd + col + 8)};
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
      const T* row = b + (8 * j + g) * C::kLd + col;
      mma_16816<T>(s[j], frag, load_pair(row), load_pair(row + 8));
    }
  }
}

// acc[n] += X Y for X the 16 x 64 fragments x[j] (8-column tiles, scaled per row by f0 for rows g
// and f1 for rows g + 8) and Y rows [0, 64) of a tile (k = tile row, n = column 8n + g).
template <class T, int D>
__device__ __forceinline__ void fragments_times_tile(float (&acc)[SmallWindow<T, D>::kDimTiles][4],
                                                     const float (&x)[SmallWindow<T, D>::kKeyTiles][4], float f0,
                                                     float f1, const T* y, int g, int t) {
  using C = SmallWindow<T, D>;
#pragma unroll
  for (int kc = 0; kc < C::kKeySteps; ++kc) {
    const int j0 = 2 * kc, j1 = 2 * kc + 1;
    uint32_t frag[4];
    frag[0] = pack_pair<T>(x[j0][0] * f0, x[j0][1] * f0);
    frag[1] = pack_pair<T>(x[j0][2] * f1, x[j0][3] * f1);
    if (j1 < C::kKeyTiles) {
      frag[2] = pack_pair<T>(x[j1][0] * f0, x[j1][1] * f0);
      frag[3] = pack_pair<T>(x[j1][2] * f1, x[j1][3] * f1);
    } else {
      frag[2] = frag[3] = 0u;
    }
    const T* rows = y + (16 * kc + 2 * t) * C::kLd + g;
#pragma unroll
    for (int n = 0; n < C::kDimTiles; ++n) {
      const T* p = rows + 8 * n;
      mma_16816<T>(acc[n], frag, pack_elements(p, p + C::kLd), pack_elements(p + 8 * C::kLd, p + 9 * C::kLd));
    }
  }
}

// acc[n] += A Y for A rows [row, row + 16) of a transposed [kRows][kLdTransposed] matrix in shared
// memory (k = its columns) and Y a tile (k = tile row).
template <class T, int D>
__device__ __forceinline__ void transposed_times_tile(float (&acc)[SmallWindow<T, D>::kDimTiles][4], const T* a,
                                                      const T* y, int row, int g, int t) {
  using C = SmallWindow<T, D>;
#pragma unroll
  for (int kc = 0; kc < C::kRows / 16; ++kc) {
    const int col = 16 * kc + 2 * t;
    const T* top = a + (row + g) * C::kLdTransposed + col;
    const T* bottom = top + 8 * C::kLdTransposed;
    const uint32_t frag[4] = {load_pair(top), load_pair(bottom), load_pair(top + 8), load_pair(bottom + 8)};
    const T* rows = y + (16 * kc + 2 * t) * C::kLd + g;
#pragma unroll
    for (int n = 0; n < C::kDimTiles; ++n) {
      const T* p = rows + 8 * n;
      mma_16816<T>(acc[n], frag, pack_elements(p, p + C::kLd), pack_elements(p + 8 * C::kLd, p + 9 * C::kLd));
    }
  }
}

// Writes the warp's accumulators acc[n] (16 rows from `row`, times `factor`) to rows `stride` apart;
// rows >= N are not written.
template <class T, int D>
__device__ __forceinline__ void store_fragments(const float (&acc)[SmallWindow<T, D>::kDimTiles][4], T* destination,
                                                size_t stride, int row, float factor, int g, int t) {
  using C = SmallWindow<T, D>;
  const int r0 = row + g, r1 = row + g + 8;
#pragma unroll
  for (int n = 0; n < C::kDimTiles; ++n) {
    const int col = 8 * n + 2 * t;
    if (r0 < C::kN) {
      *reinterpret_cast<uint32_t*>(destination + r0 * stride + col) =
          pack_pair<T>(factor * acc[n][0], factor * acc[n][1]);
    }
    if (r1 < C::kN) {
      *reinterpret_cast<uint32_t*>(destination + r1 * stride + col) =
          pack_pair<T>(factor * acc[n][2], factor * acc[n][3]);
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(SmallWindow<T, D>::kThreads)
    window_attention_forward_small_kernel(const T* __restrict__ qkv, const float* __restrict__ bias,
                                          const float* __restrict__ mask, T* __restrict__ out, float* __restrict__ lse,
                                          int heads, WindowDeal deal, float scale) {
  using C = SmallWindow<T, D>;
  constexpr int N = C::kN;
  extern __shared__ __align__(128) unsigned char shared[];
  T* tiles = reinterpret_cast<T*>(shared);  // [stage][Q, K, V][kRows][kLd]
  const int cls = blockIdx.x / deal.parts, part = blockIdx.x % deal.parts;
  const int h = cls / deal.mask_windows, m = cls % deal.mask_windows;
  const int first = part * deal.chunk, last = min(deal.per_class, first + deal.chunk);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;

  auto fetch = [&](int k, int stage) {
    const T* source = qkv + static_cast<size_t>(m + deal.mask_windows * k) * N * qkv_stride + h * D;
    T* tile = tiles + stage * C::kForwardTiles * C::kTile;
    copy_tile_async<T, D>(tile, source, qkv_stride);
    copy_tile_async<T, D>(tile + C::kTile, source + heads * D, qkv_stride);
    copy_tile_async<T, D>(tile + 2 * C::kTile, source + 2 * heads * D, qkv_stride);
    copy_async_commit();
  };
  fetch(first, 0);
  zero_padding_rows<T, D>(tiles, 2 * C::kForwardTiles);
  float add[C::kKeyTiles][4];
  load_window_bias<N, C::kKeyTiles>(add, bias + static_cast<size_t>(h) * N * N,
                                    mask ? mask + static_cast<size_t>(m) * N * N : nullptr, r0, t);
  const float qk_scale = scale * kLog2e;

  for (int k = first; k < last; ++k) {
    const int stage = (k - first) & 1;
    if (k + 1 < last) {
      fetch(k + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();
    const T* q = tiles + stage * C::kForwardTiles * C::kTile;
    float s[C::kKeyTiles][4];
    row_scores<T, D>(s, q, q + C::kTile, r0, g, t);

    // Softmax in the log2 domain; rows r0 (elements 0, 1) and r1 (2, 3) spread over the 4 lanes t.
    float high0 = -INFINITY, high1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = fmaf(s[j][e], qk_scale, add[j][e]);
      high0 = fmaxf(high0, fmaxf(s[j][0], s[j][1]));
      high1 = fmaxf(high1, fmaxf(s[j][2], s[j][3]));
    }
    high0 = lane_group_max<4>(high0);
    high1 = lane_group_max<4>(high1);
    const float shift0 = high0 == -INFINITY ? 0.f : high0, shift1 = high1 == -INFINITY ? 0.f : high1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
      s[j][0] = exp2f(s[j][0] - shift0);
      s[j][1] = exp2f(s[j][1] - shift0);
      s[j][2] = exp2f(s[j][2] - shift1);
      s[j][3] = exp2f(s[j][3] - shift1);
      sum0 += s[j][0] + s[j][1];
      sum1 += s[j][2] + s[j][3];
    }
    sum0 = lane_group_sum<4>(sum0);
    sum1 = lane_group_sum<4>(sum1);
    const size_t window = static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k;
    if (t == 0) {
      // +inf for a row with no key: the backward's exp(S - lse) is then 0 there.
      float* lse_rows = lse + (window * heads + h) * N;
      if (r0 < N) lse_rows[r0] = sum0 > 0.f ? (shift0 + log2f(sum0)) * kLn2 : INFINITY;
      if (r1 < N) lse_rows[r1] = sum1 > 0.f ? (shift1 + log2f(sum1)) * kLn2 : INFINITY;
    }

    float o[C::kDimTiles][4] = {};
    fragments_times_tile<T, D>(o, s, sum0 > 0.f ? 1.f / sum0 : 0.f, sum1 > 0.f ? 1.f / sum1 : 0.f, q + 2 * C::kTile, g,
                               t);
    store_fragments<T, D>(o, out + window * N * out_stride + h * D, out_stride, 16 * warp, 1.f, g, t);
    __syncthreads();  // the stage is refilled with window k + 2
  }
}

template <class T, int D>
__global__ void __launch_bounds__(SmallWindow<T, D>::kThreads, SmallWindow<T, D>::kBackwardBlocksPerSm)
    window_attention_backward_small_kernel(const T* __restrict__ qkv, const float* __restrict__ bias,
                                           const float* __restrict__ mask, const float* __restrict__ lse,
                                           const T* __restrict__ dout, T* __restrict__ dqkv,
                                           float* __restrict__ partials, int heads, WindowDeal deal, float scale) {
  using C = SmallWindow<T, D>;
  constexpr int N = C::kN;
  extern __shared__ __align__(128) unsigned char shared[];
  T* tiles = reinterpret_cast<T*>(shared);  // [stage][Q, K, V, dO][kRows][kLd]
  T* probs_t = reinterpret_cast<T*>(shared + 2 * C::kBackwardTiles * sizeof(T) * C::kTile);         // P^T [key][query]
  T* ds_t = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(probs_t) + C::kTransposedBytes);  // dS^T
  float* row_lse =
      reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(ds_t) + C::kTransposedBytes);  // [stage][kRows]
  const int cls = blockIdx.x / deal.parts, part = blockIdx.x % deal.parts;
  const int h = cls / deal.mask_windows, m = cls % deal.mask_windows;
  const int first = part * deal.chunk, last = min(deal.per_class, first + deal.chunk);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;

  auto fetch = [&](int k, int stage) {
    const size_t window = static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k;
    const T* source = qkv + window * N * qkv_stride + h * D;
    T* tile = tiles + stage * C::kBackwardTiles * C::kTile;
    copy_tile_async<T, D>(tile, source, qkv_stride);
    copy_tile_async<T, D>(tile + C::kTile, source + heads * D, qkv_stride);
    copy_tile_async<T, D>(tile + 2 * C::kTile, source + 2 * heads * D, qkv_stride);
    copy_tile_async<T, D>(tile + 3 * C::kTile, dout + window * N * out_stride + h * D, out_stride);
    if (threadIdx.x < N)
      copy_async4(row_lse + stage * C::kRows + threadIdx.x, lse + (window * heads + h) * N + threadIdx.x);
    copy_async_commit();
  };
  fetch(first, 0);
  zero_padding_rows<T, D>(tiles, 2 * C::kBackwardTiles);
  // P^T and dS^T: rows (keys) past the 56 the fragments write stay zero.
  for (int e = threadIdx.x; e < 2 * static_cast<int>(C::kTransposedBytes / 16); e += C::kThreads) {
    reinterpret_cast<int4*>(probs_t)[e] = make_int4(0, 0, 0, 0);
  }
  float add[C::kKeyTiles][4];
  load_window_bias<N, C::kKeyTiles>(add, bias + static_cast<size_t>(h) * N * N,
                                    mask ? mask + static_cast<size_t>(m) * N * N : nullptr, r0, t);
  float dbias[C::kKeyTiles][4] = {};
  const float qk_scale = scale * kLog2e;

  for (int k = first; k < last; ++k) {
    const int stage = (k - first) & 1;
    if (k + 1 < last) {
      fetch(k + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();
    const T* q = tiles + stage * C::kBackwardTiles * C::kTile;
    const T* key = q + C::kTile;
    const T* value = q + 2 * C::kTile;
    const T* grad = q + 3 * C::kTile;
    const size_t window = static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k;

    // P = exp(S - lse), recomputed in float; 0 for padded rows, padded keys and rows with no key.
    float p[C::kKeyTiles][4];
    row_scores<T, D>(p, q, key, r0, g, t);
    const float lse0 = r0 < N ? row_lse[stage * C::kRows + r0] * kLog2e : INFINITY;
    const float lse1 = r1 < N ? row_lse[stage * C::kRows + r1] * kLog2e : INFINITY;
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[j][e] = exp2f(fmaf(p[j][e], qk_scale, add[j][e]) - (e < 2 ? lse0 : lse1));
    }
    // dP = dO V^T; D_i = rowsum(P * dP); dS = P (dP - D), summed into the bias gradient in float.
    float ds[C::kKeyTiles][4];
    row_scores<T, D>(ds, grad, value, r0, g, t);
    float d0 = 0.f, d1 = 0.f;
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
      d0 += p[j][0] * ds[j][0] + p[j][1] * ds[j][1];
      d1 += p[j][2] * ds[j][2] + p[j][3] * ds[j][3];
    }
    d0 = lane_group_sum<4>(d0);
    d1 = lane_group_sum<4>(d1);
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        ds[j][e] = p[j][e] * (ds[j][e] - (e < 2 ? d0 : d1));
        dbias[j][e] += ds[j][e];
        // P^T and dS^T for the key-major products below.
        const int key_index = 8 * j + 2 * t + (e & 1), query = e < 2 ? r0 : r1;
        probs_t[key_index * C::kLdTransposed + query] = from_float<T>(p[j][e]);
        ds_t[key_index * C::kLdTransposed + query] = from_float<T>(ds[j][e]);
      }
    }
    T* dq_rows = dqkv + window * N * qkv_stride + h * D;
    {
      // dQ = scale dS K for the warp's rows, dS straight from the registers.
      float dq[C::kDimTiles][4] = {};
      fragments_times_tile<T, D>(dq, ds, 1.f, 1.f, key, g, t);
      store_fragments<T, D>(dq, dq_rows, qkv_stride, 16 * warp, scale, g, t);
    }
    __syncthreads();  // P^T and dS^T complete
    {
      // dV = P^T dO and dK = scale dS^T Q for keys 16w..16w+15.
      float dv[C::kDimTiles][4] = {}, dk[C::kDimTiles][4] = {};
      transposed_times_tile<T, D>(dv, probs_t, grad, 16 * warp, g, t);
      transposed_times_tile<T, D>(dk, ds_t, q, 16 * warp, g, t);
      store_fragments<T, D>(dv, dq_rows + 2 * heads * D, qkv_stride, 16 * warp, 1.f, g, t);
      store_fragments<T, D>(dk, dq_rows + heads * D, qkv_stride, 16 * warp, scale, g, t);
    }
    __syncthreads();  // the stage is refilled with window k + 2; P^T and dS^T are rewritten
  }

  // This block's sum of dS over its windows into its own slice (m * parts + part) of the workspace.
  float* partial = partials + ((static_cast<size_t>(m) * deal.parts + part) * heads + h) * static_cast<size_t>(N) * N;
#pragma unroll
  for (int j = 0; j < C::kKeyTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e < 2 ? r0 : r1, c = 8 * j + 2 * t + (e & 1);
      if (r < N && c < N) partial[r * N + c] = dbias[j][e];
    }
  }
}

// ---- kernel launchers

template <class T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>, tokens, head dim) with compile-time values; the shape is checked before.
template <class FN>
void dispatch(DType dtype, int tokens, int head_dim, FN&& fn) {
  auto by_dim = [&](auto type, auto n) {
    if (head_dim == 32)
      fn(type, n, std::integral_constant<int, 32>{});
    else
      fn(type, n, std::integral_constant<int, 64>{});
  };
  auto by_tokens = [&](auto type) {
    if (tokens == 49)
      by_dim(type, std::integral_constant<int, 49>{});
    else
      by_dim(type, std::integral_constant<int, 144>{});
  };
  if (dtype == DType::f16)
    by_tokens(TypeTag<__half>{});
  else
    by_tokens(TypeTag<__nv_bfloat16>{});
}

// Slices of the backward's bias-gradient workspace (blocks per head): for 49 tokens one per block
// of a head (mask windows x parts); otherwise as many (slice, head) blocks as are resident at once,
// at most one per window.
template <class T, int N, int D>
int backward_slices(const WindowAttentionShape& s) {
  if (s.windows == 0) return 0;
  if constexpr (N == SmallWindow<T, D>::kN) {
    const WindowDeal deal = deal_windows(s, SmallWindow<T, D>::kBackwardChunk);
    return deal.mask_windows * deal.parts;
  } else {
    using C = Config<T, N, D>;
    allow_shared<window_attention_backward_kernel<T, N, D>>(C::kBackwardBytes);
    static const int resident =
        resident_blocks(window_attention_backward_kernel<T, N, D>, C::kThreads, C::kBackwardBytes);
    return std::max(1, std::min(s.windows, resident / s.heads));
  }
}

void check_aligned(const void* p, const char* name) {
  if (!aligned16(p)) {
    throw std::invalid_argument(std::string("window_attention: ") + name + " must be 16-byte aligned");
  }
}

}  // namespace

void check_window_attention(DType dtype, const WindowAttentionShape& s) {
  std::string problem;
  if (dtype != DType::f16 && dtype != DType::bf16) {
    problem = std::string("dtype ") + dtype_name(dtype) + " is not supported (fp16, bf16)";
  } else if (s.tokens != 49 && s.tokens != 144) {
    problem = "tokens must be 49 (window 7) or 144 (window 12), got " + std::to_string(s.tokens);
  } else if (s.head_dim != 32 && s.head_dim != 64) {
    problem = "head_dim must be 32 or 64, got " + std::to_string(s.head_dim);
  } else if (s.heads < 1 || s.heads > kMaxHeads) {
    problem = "heads must be in [1, " + std::to_string(kMaxHeads) + "], got " + std::to_string(s.heads);
  } else if (s.windows < 0) {
    problem = "windows must be >= 0, got " + std::to_string(s.windows);
  } else if (s.mask_windows < 0 || (s.mask_windows > 0 && s.windows % s.mask_windows != 0)) {
    problem = "mask_windows must be 0 or divide windows (" + std::to_string(s.windows) + "), got " +
              std::to_string(s.mask_windows);
  } else if (static_cast<long long>(s.windows) * s.heads > (1LL << 30)) {
    problem = "windows x heads must be at most 2^30";
  }
  if (!problem.empty()) throw std::invalid_argument("window_attention: " + problem);
}

void window_attention_forward(DType dtype, const void* qkv, const void* table, const int32_t* index, const float* mask,
                              void* out, float* bias, float* lse, const WindowAttentionShape& s, float scale,
                              cudaStream_t stream) {
  check_window_attention(dtype, s);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  if (s.mask_windows > 0 && !mask) throw std::invalid_argument("window_attention: mask_windows > 0 needs a mask");
  const int pairs = s.tokens * s.tokens;
  dispatch(dtype, s.tokens, s.head_dim, [&](auto type, auto n, auto d) {
    using T = typename decltype(type)::type;
    constexpr int N = decltype(n)::value, D = decltype(d)::value;
    using C = Config<T, N, D>;
    window_bias_gather_kernel<T>
        <<<ceil_div(s.heads * pairs, 256), 256, 0, stream>>>(static_cast<const T*>(table), index, bias, s.heads, pairs);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    if (s.windows == 0) return;
    if constexpr (N == SmallWindow<T, D>::kN) {
      using S = SmallWindow<T, D>;
      const WindowDeal deal = deal_windows(s, S::kForwardChunk);
      allow_shared<window_attention_forward_small_kernel<T, D>>(S::kForwardBytes);
      window_attention_forward_small_kernel<T, D><<<deal.blocks(s.heads), S::kThreads, S::kForwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<T*>(out), lse, s.heads,
          deal, scale);
    } else {
      allow_shared<window_attention_forward_kernel<T, N, D>>(C::kForwardBytes);
      window_attention_forward_kernel<T, N, D><<<s.windows * s.heads, C::kThreads, C::kForwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<T*>(out), lse, s.heads,
          std::max(s.mask_windows, 1), scale);
    }
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

size_t window_attention_backward_workspace_bytes(const WindowAttentionShape& s) {
  check_window_attention(DType::f16, s);  // both 16-bit types: the larger of their needs
  size_t bytes = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    dispatch(dtype, s.tokens, s.head_dim, [&](auto type, auto n, auto d) {
      using T = typename decltype(type)::type;
      constexpr int N = decltype(n)::value, D = decltype(d)::value;
      const int slices = backward_slices<T, N, D>(s);
      bytes = std::max(bytes, sizeof(float) * (static_cast<size_t>(slices) + 1) * s.heads * N * N);
    });
  }
  return bytes;
}

void window_attention_backward(DType dtype, const void* qkv, const float* bias, const float* mask, const void* out,
                               const float* lse, const void* dout, const int32_t* index, void* dqkv, void* dtable,
                               void* workspace, const WindowAttentionShape& s, float scale, cudaStream_t stream) {
  check_window_attention(dtype, s);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  check_aligned(dout, "dout");
  check_aligned(dqkv, "dqkv");
  if (s.mask_windows > 0 && !mask) throw std::invalid_argument("window_attention: mask_windows > 0 needs a mask");
  const int pairs = s.tokens * s.tokens, window = s.tokens == 49 ? 7 : 12;
  const int entries = (2 * window - 1) * (2 * window - 1);
  dispatch(dtype, s.tokens, s.head_dim, [&](auto type, auto n, auto d) {
    using T = typename decltype(type)::type;
    constexpr int N = decltype(n)::value, D = decltype(d)::value;
    using C = Config<T, N, D>;
    const int slices = backward_slices<T, N, D>(s);
    float* partials = static_cast<float*>(workspace);
    float* dbias = partials + static_cast<size_t>(slices) * s.heads * pairs;
    if constexpr (N == SmallWindow<T, D>::kN) {
      using S = SmallWindow<T, D>;
      if (slices > 0) {
        const WindowDeal deal = deal_windows(s, S::kBackwardChunk);
        allow_shared<window_attention_backward_small_kernel<T, D>>(S::kBackwardBytes);
        window_attention_backward_small_kernel<T, D><<<deal.blocks(s.heads), S::kThreads, S::kBackwardBytes, stream>>>(
            static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, lse, static_cast<const T*>(dout),
            static_cast<T*>(dqkv), partials, s.heads, deal, scale);
        FUSEKIT_CUDA_CHECK(cudaGetLastError());
      }
    } else if (slices > 0) {
      window_attention_backward_kernel<T, N, D><<<slices * s.heads, C::kThreads, C::kBackwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<const T*>(out), lse,
          static_cast<const T*>(dout), static_cast<T*>(dqkv), partials, s.windows, s.heads, std::max(s.mask_windows, 1),
          slices, scale);
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
    }
    const int count = s.heads * pairs;
    window_bias_reduce_kernel<<<ceil_div(count, kWarpSize), dim3(kWarpSize, kSliceGroups), 0, stream>>>(partials, dbias,
                                                                                                        count, slices);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    window_table_gradient_kernel<T><<<ceil_div(entries * kWarpSize, 256), 256, 0, stream>>>(
        dbias, index, static_cast<T*>(dtable), entries, s.heads, pairs);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace fusekit::kernels
