// Swin window attention for 49-token windows (window 7): forward and backward, scores in registers.
//
// A block of 4 warps works through `chunk` windows of one head h and one mask window m (windows
// m, m + mask_windows, m + 2 mask_windows, ...), so the bias and mask it adds are the same for all
// of them: each thread loads its 28 values of bias + mask once and keeps them in registers, and no
// window reads the bias or the mask again. Warp w owns query rows 16w..16w+15 (the fourth warp holds
// one real row). S = Q K^T, the softmax and P stay in mma fragments (kernels/detail/mma_fragments.cuh);
// P is the left operand of P V straight from the accumulators. Q, K, V (and dO) of the next window
// are copied into the other of two shared-memory stages (cp.async) while the current one is
// computed, so every block keeps a window's loads in flight. The backward takes D_i as
// rowsum(P * dP) over the registers (equal to dO_i . O_i, FlashAttention's identity), so it does
// not read O, and keeps its dS summed over its windows in registers for the bias-table gradient.
#pragma once

#include "kernels/detail/mma_fragments.cuh"
#include "kernels/detail/window_attention_common.cuh"

namespace fusekit::kernels {
// Included by window_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

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

// acc[n] += A Y for A one 16 x 16 fragment and Y rows [16 kc, 16 kc + 16) of a tile (n: columns 8n..).
template <class T, int D>
__device__ __forceinline__ void fragment_times_tile_rows(float (&acc)[SmallWindow<T, D>::kDimTiles][4],
                                                         const uint32_t (&frag)[4], const T* y, int kc, int g, int t) {
  using C = SmallWindow<T, D>;
  const T* rows = y + (16 * kc + 2 * t) * C::kLd + g;
#pragma unroll
  for (int n = 0; n < C::kDimTiles; ++n) {
    const T* p = rows + 8 * n;
    mma_16816<T>(acc[n], frag, pack_elements(p, p + C::kLd), pack_elements(p + 8 * C::kLd, p + 9 * C::kLd));
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
    fragment_times_tile_rows<T, D>(acc, frag, y, kc, g, t);
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
    fragment_times_tile_rows<T, D>(acc, frag, y, kc, g, t);
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
  const WindowDeal::Block block = deal.block(blockIdx.x);
  const int h = block.h, m = block.m, first = block.first, last = block.last;
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
    float shift0, shift1, sum0, sum1;
    exponentiate_rows(s, high0, high1, shift0, shift1, sum0, sum1);
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
  const WindowDeal::Block block = deal.block(blockIdx.x);
  const int h = block.h, m = block.m, part = block.part, first = block.first, last = block.last;
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

}  // namespace
}  // namespace fusekit::kernels
