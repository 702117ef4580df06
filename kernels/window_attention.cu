// Swin window attention forward and backward (see window_attention.h for the math and layouts).
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
#include "kernels/window_attention.h"

namespace fusekit::kernels {
namespace {

using namespace nvcuda;

constexpr float kLog2e = 1.4426950408889634f;
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

// dbias[h, i, j] = sum over slices of partials[slice, h, i, j], one thread per element.
__global__ void window_bias_reduce_kernel(const float* __restrict__ partials, float* __restrict__ dbias, int count,
                                          int slices) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= count) return;
  float sum = 0.f;
  for (int s = 0; s < slices; ++s) sum += partials[static_cast<size_t>(s) * count + e];
  dbias[e] = sum;
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

// Blocks per head of the backward: as many (slice, head) blocks as are resident at once, at most
// one per window.
template <class T, int N, int D>
int backward_slices(const WindowAttentionShape& s) {
  using C = Config<T, N, D>;
  allow_shared<window_attention_backward_kernel<T, N, D>>(C::kBackwardBytes);
  static const int resident =
      resident_blocks(window_attention_backward_kernel<T, N, D>, C::kThreads, C::kBackwardBytes);
  return std::max(1, std::min(s.windows, resident / s.heads));
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
    allow_shared<window_attention_forward_kernel<T, N, D>>(C::kForwardBytes);
    window_attention_forward_kernel<T, N, D><<<s.windows * s.heads, C::kThreads, C::kForwardBytes, stream>>>(
        static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<T*>(out), lse, s.heads,
        std::max(s.mask_windows, 1), scale);
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
      const int slices = s.windows > 0 ? backward_slices<T, N, D>(s) : 0;
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
    const int slices = s.windows > 0 ? backward_slices<T, N, D>(s) : 0;
    float* partials = static_cast<float*>(workspace);
    float* dbias = partials + static_cast<size_t>(slices) * s.heads * pairs;
    if (slices > 0) {
      window_attention_backward_kernel<T, N, D><<<slices * s.heads, C::kThreads, C::kBackwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<const T*>(out), lse,
          static_cast<const T*>(dout), static_cast<T*>(dqkv), partials, s.windows, s.heads, std::max(s.mask_windows, 1),
          slices, scale);
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
    }
    const int count = s.heads * pairs;
    window_bias_reduce_kernel<<<ceil_div(count, 256), 256, 0, stream>>>(partials, dbias, count, slices);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    window_table_gradient_kernel<T><<<ceil_div(entries * kWarpSize, 256), 256, 0, stream>>>(
        dbias, index, static_cast<T*>(dtable), entries, s.heads, pairs);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace fusekit::kernels
