// Swin window attention forward and backward (see window_attention.h for the math and layouts).
// Both window sizes keep their scores in mma.sync register fragments (kernels/mma_fragments.cuh):
// "49-token windows" and "144-token windows" below. A block works through a run of windows that
// share one head and one mask window, so the bias + mask it adds are loaded once per block; the
// backward's bias gradient is summed per block into the block's own slice of the workspace, then
// two small kernels sum the slices (window_bias_reduce_kernel) and fold [heads, N, N] into the
// table through the index (window_table_gradient_kernel: a warp per table entry, a lane per head).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_tiles.cuh"  // allow_shared
#include "kernels/common.cuh"
#include "kernels/mma_fragments.cuh"
#include "kernels/window_attention.h"

namespace fusekit::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxHeads = 64;  // the table gradient's warp holds two heads per lane

// ---- CUDA kernels

// The gathered bias: bias[h, i, j] = table[index[i, j], h], one thread per element.
template <class T>
__global__ void window_bias_gather_kernel(const T* __restrict__ table, const int32_t* __restrict__ index,
                                          float* __restrict__ bias, int heads, int pairs) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= heads * pairs) return;
  const int h = e / pairs, ij = e % pairs;
  bias[e] = to_float(table[static_cast<size_t>(index[ij]) * heads + h]);
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

  // Block `index`'s head h, mask window m, part of its class and windows' range [first, last) of k.
  struct Block {
    int h, m, part, first, last;
  };
  __device__ Block block(unsigned index) const {  // unsigned: blockIdx.x
    const int cls = index / parts, part = index % parts;
    const int h = cls / mask_windows, m = cls % mask_windows;
    const int first = part * chunk;
    return {h, m, part, first, min(per_class, first + chunk)};
  }
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

// The softmax numerators of a warp's scores in fragments (log2 domain), rows g (elements 0, 1) and
// g + 8 (2, 3), each spread over the 4 lanes t, given the lanes' own row maxima high0, high1:
// s = exp2(s - shift) with shift the row maximum (0 for a row with no key: every term is then 0),
// and the row sums of the results.
template <int TILES>
__device__ __forceinline__ void exponentiate_rows(float (&s)[TILES][4], float high0, float high1, float& shift0,
                                                  float& shift1, float& sum0, float& sum1) {
  high0 = lane_group_max<4>(high0);
  high1 = lane_group_max<4>(high1);
  shift0 = high0 == -INFINITY ? 0.f : high0;
  shift1 = high1 == -INFINITY ? 0.f : high1;
  sum0 = 0.f;
  sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    s[j][0] = exp2f(s[j][0] - shift0);
    s[j][1] = exp2f(s[j][1] - shift0);
    s[j][2] = exp2f(s[j][2] - shift1);
    s[j][3] = exp2f(s[j][3] - shift1);
    sum0 += s[j][0] + s[j][1];
    sum1 += s[j][2] + s[j][3];
  }
  sum0 = lane_group_sum<4>(sum0);
  sum1 = lane_group_sum<4>(sum1);
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

// ---- 144-token windows (window 12): scores in registers, bias + mask in shared memory
//
// As for 49 tokens, a block works through `chunk` windows of one head h and one mask window m, with
// Q, K, V (and dO) of the next window copied into a second shared-memory stage while the current
// one is computed. 144 = 9 x 16 needs no padding: 9 warps, warp w owns rows 16w..16w+15. A thread's
// 16 x 144 share of S is 72 floats, so its 72 values of (bias + mask) log2 e cannot stay in
// registers as well: the block writes them once, in float, to a shared-memory table laid out in
// fragment order ([warp][8-column tile][lane] float4), from which every window reads them back with
// one conflict-free 16-byte load per tile. Only the thread that wrote a slot reads it. (In T the
// table would lose the bias next to a -100 mask entry, and in bf16 the bias itself.)
// Operands come from shared memory through ldmatrix (kernels/mma_fragments.cuh).
//
// Forward: S = Q K^T for the warp's 16 queries, softmax over the 144 keys in registers (a row spread
// over the 4 lanes of a quad), P straight from the accumulators as the A operand of P V.
//
// Backward: warp w owns keys 16w..16w+15 and computes S^T = K Q^T and dP^T = V dO^T in passes of
// kPass queries, so that P^T and dS^T = P^T (dP^T - D) sit in registers: P^T is the A operand of
// dV = P^T dO straight from the accumulators (dV accumulates over the passes), and dS^T is added to
// the thread's 72 dS sums (over the block's windows, in float registers, stored once into the
// block's slice of the workspace as the 49-token backward does) and written to shared memory in T,
// from which dK = dS^T Q and dQ = dS K (transposed ldmatrix) take it after a barrier. D_i, a sum
// over all keys that no warp holds, is dO_i . O_i, with O copied in beside the window. A 9-warp
// block gets at most 168 registers a thread (the 4 SM sub-partitions hold 3, 2, 2, 2 of its warps);
// the 72 dS sums leave a little too few, and ptxas spills a few (ptxas -v: 40 bytes for D = 32,
// 112 for D = 64). For D = 64 only one stage fits beside the table and dS^T, so the next window's
// copies start when the current one is done.

template <class T, int D>
struct LargeWindow {
  static constexpr int kN = 144;
  static constexpr int kWarps = kN / 16;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kTiles = kN / 8;         // 8-column tiles of a warp's S (S^T): 18
  static constexpr int kSteps = kN / 16;        // 16-deep steps over the keys: 9
  static constexpr int kDimTiles = D / 8;       // 8-column tiles of O, dQ, dK, dV
  static constexpr int kDimSteps = D / 16;      // 16-deep steps over the head dimension
  static constexpr int kLd = D + 8;             // T per tile row: conflict-free ldmatrix rows
  static constexpr int kLdTransposed = kN + 8;  // T per row of dS^T
  static constexpr int kTile = kN * kLd;        // T per tile
  static constexpr size_t kTileBytes = sizeof(T) * kTile;
  static constexpr size_t kTableBytes = sizeof(float) * kN * kN;
  static constexpr size_t kTransposedBytes = sizeof(T) * kN * kLdTransposed;
  static constexpr size_t kRowBytes = sizeof(float) * kN;
  static constexpr int kForwardTiles = 3;   // Q, K, V
  static constexpr int kBackwardTiles = 4;  // Q, K, V, dO
  static constexpr int kBackwardStages = D == 32 ? 2 : 1;
  static constexpr int kPass = 16;  // queries per backward pass (registers: ptxas -v)
  static constexpr int kPassTiles = kPass / 8;
  static constexpr size_t kOutBytes = sizeof(T) * kN * D;  // O of one window, unpadded
  // [stage][Q, K, V][kN][kLd], then the table.
  static constexpr size_t kForwardBytes = 2 * kForwardTiles * kTileBytes + kTableBytes;
  // [stage][Q, K, V, dO][kN][kLd], the table, dS^T, O, lse [stage][kN], D [kN].
  static constexpr size_t kBackwardBytes = kBackwardStages * (kBackwardTiles * kTileBytes + kRowBytes) + kTableBytes +
                                           kTransposedBytes + kOutBytes + kRowBytes;
  static constexpr int kForwardChunk = 16, kBackwardChunk = 16;  // windows per block
  static_assert(kN % 16 == 0 && kN % kPass == 0 && kPass % 16 == 0, "tiling");
  static_assert(kTileBytes % 16 == 0 && kTransposedBytes % 16 == 0 && kOutBytes % 16 == 0 && kRowBytes % 16 == 0,
                "16-byte regions");
  static_assert(kForwardBytes <= 227 * 1024 && kBackwardBytes <= 227 * 1024, "shared memory of one block on sm_90");
};

// This thread's (bias + mask) log2 e into its slots of the warp's table (slots[j * 32], j < kTiles):
// fragment rows r0 (elements 0, 1) and r0 + 8 (2, 3), columns 8j + 2t (+1). The fragment is S
// (rows are queries) or, kTransposed, S^T (rows are keys); bias and mask are [query][key].
template <class C, bool kTransposed>
__device__ __forceinline__ void store_window_bias(float4* slots, const float* __restrict__ bias_h,
                                                  const float* __restrict__ mask_m, int r0, int t) {
  constexpr int N = C::kN;
#pragma unroll 6
  for (int j = 0; j < C::kTiles; ++j) {
    float value[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e < 2 ? r0 : r0 + 8;
      const int ij = kTransposed ? (8 * j + 2 * t + (e & 1)) * N + r : r * N + 8 * j + 2 * t + (e & 1);
      value[e] = __ldg(bias_h + ij);
      if (mask_m) value[e] += __ldg(mask_m + ij);
    }
    slots[j * kWarpSize] = make_float4(value[0] * kLog2e, value[1] * kLog2e, value[2] * kLog2e, value[3] * kLog2e);
  }
}

// The window's kN rows from rows `stride` elements apart into a tile of rows LD apart,
// asynchronously, 16 bytes a copy.
template <class T, int D, int LD = LargeWindow<T, D>::kLd>
__device__ __forceinline__ void copy_window_async(T* tile, const T* __restrict__ source, size_t stride) {
  using C = LargeWindow<T, D>;
  constexpr int kVecs = D / 8;
  static_assert(C::kN * kVecs % C::kThreads == 0, "whole rounds");
#pragma unroll
  for (int x = 0; x < C::kN * kVecs / C::kThreads; ++x) {
    const int e = threadIdx.x + x * C::kThreads, r = e / kVecs, c = e % kVecs * 8;
    copy_async16(tile + r * LD + c, source + r * stride + c);
  }
}

// Writes accumulators acc[n] (16 rows from `row`, columns 8n.., times `factor`) to rows `stride`
// elements apart, 4 bytes per store.
template <class T, int TILES>
__device__ __forceinline__ void store_row_fragments(const float (&acc)[TILES][4], T* destination, size_t stride,
                                                    int row, float factor, int g, int t) {
  T* top = destination + static_cast<size_t>(row + g) * stride + 2 * t;
  T* bottom = top + 8 * stride;
#pragma unroll
  for (int n = 0; n < TILES; ++n) {
    *reinterpret_cast<uint32_t*>(top + 8 * n) = pack_pair<T>(factor * acc[n][0], factor * acc[n][1]);
    *reinterpret_cast<uint32_t*>(bottom + 8 * n) = pack_pair<T>(factor * acc[n][2], factor * acc[n][3]);
  }
}

// The A fragment of a 16x16 block from two side-by-side accumulator tiles (kernels/mma_fragments.cuh).
template <class T>
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4],
                                                  float f0, float f1) {
  a[0] = pack_pair<T>(left[0] * f0, left[1] * f0);
  a[1] = pack_pair<T>(left[2] * f1, left[3] * f1);
  a[2] = pack_pair<T>(right[0] * f0, right[1] * f0);
  a[3] = pack_pair<T>(right[2] * f1, right[3] * f1);
}

// acc[j] += A B^T for the 16-row A at `a` (rows kLd apart) and 8-row tiles j of B from `b` on, both
// with `depth` columns (16 per step): S = Q K^T, or S^T = K Q^T.
template <class T, int D, int TILES>
__device__ __forceinline__ void multiply_transposed(float (&acc)[TILES][4], const T* a, const T* b, int lane) {
  using C = LargeWindow<T, D>;
  static_assert(TILES % 2 == 0, "pairs of 8-row tiles");
  // ldmatrix rows: for A, lanes 0..15 rows 0..15 at column 0, lanes 16..31 the same rows at column 8;
  // for B^T, matrix i = lane / 8 is rows 8 (i / 2).., columns 8 (i % 2)..
  const T* a_lane = a + (lane & 15) * C::kLd + (lane >> 4) * 8;
  const T* b_lane = b + ((lane & 7) + (lane >> 4) * 8) * C::kLd + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kc = 0; kc < C::kDimSteps; ++kc) {
    uint32_t frag[4];
    load_matrix_x4(frag, shared_address(a_lane + 16 * kc));
#pragma unroll
    for (int jp = 0; jp < TILES / 2; ++jp) {
      uint32_t pair[4];
      load_matrix_x4(pair, shared_address(b_lane + 16 * jp * C::kLd + 16 * kc));
      mma_16816<T>(acc[2 * jp], frag, pair[0], pair[1]);
      mma_16816<T>(acc[2 * jp + 1], frag, pair[2], pair[3]);
    }
  }
}

// acc[n] += A Y for the A fragment of one 16-deep step and rows [0, 16) of the tile at y (k = the
// tile's rows, n = its columns 8n..).
template <class T, int D>
__device__ __forceinline__ void fragment_times_rows(float (&acc)[D / 8][4], const uint32_t (&a)[4], const T* y,
                                                    int lane) {
  using C = LargeWindow<T, D>;
  // Transposed ldmatrix: matrix i = lane / 8 is rows 8 (i % 2).., columns 8 (i / 2)..
  const T* y_lane = y + (lane & 15) * C::kLd + (lane >> 4) * 8;
#pragma unroll
  for (int np = 0; np < C::kDimSteps; ++np) {
    uint32_t pair[4];
    load_matrix_x4_transposed(pair, shared_address(y_lane + 16 * np));
    mma_16816<T>(acc[2 * np], a, pair[0], pair[1]);
    mma_16816<T>(acc[2 * np + 1], a, pair[2], pair[3]);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(LargeWindow<T, D>::kThreads, 1)
    window_attention_forward_large_kernel(const T* __restrict__ qkv, const float* __restrict__ bias,
                                          const float* __restrict__ mask, T* __restrict__ out, float* __restrict__ lse,
                                          int heads, WindowDeal deal, float scale) {
  using C = LargeWindow<T, D>;
  constexpr int N = C::kN;
  extern __shared__ __align__(128) unsigned char shared[];
  T* tiles = reinterpret_cast<T*>(shared);  // [stage][Q, K, V][kN][kLd]
  float4* table = reinterpret_cast<float4*>(shared + 2 * C::kForwardTiles * C::kTileBytes);
  const WindowDeal::Block block = deal.block(blockIdx.x);
  const int h = block.h, m = block.m, first = block.first, last = block.last;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int row = 16 * warp;  // the warp's queries
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;

  auto fetch = [&](int k, int stage) {
    const T* source =
        qkv + (static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k) * N * qkv_stride + h * D;
    T* tile = tiles + stage * C::kForwardTiles * C::kTile;
    copy_window_async<T, D>(tile, source, qkv_stride);
    copy_window_async<T, D>(tile + C::kTile, source + heads * D, qkv_stride);
    copy_window_async<T, D>(tile + 2 * C::kTile, source + 2 * heads * D, qkv_stride);
    copy_async_commit();
  };
  fetch(first, 0);

  // This thread's (bias + mask) log2 e at its S positions: query rows row + g (elements 0, 1) and
  // row + g + 8 (2, 3), keys 8j + 2t (+1).
  float4* slots = table + warp * C::kTiles * kWarpSize + lane;
  store_window_bias<C, false>(slots, bias + static_cast<size_t>(h) * N * N,
                              mask ? mask + static_cast<size_t>(m) * N * N : nullptr, row + g, t);
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
    float s[C::kTiles][4];
#pragma unroll
    for (int j = 0; j < C::kTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    multiply_transposed<T, D, C::kTiles>(s, q + row * C::kLd, q + C::kTile, lane);

    // Softmax in the log2 domain; rows g (elements 0, 1) and g + 8 (2, 3) spread over the 4 lanes t.
    float high0 = -INFINITY, high1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < C::kTiles; ++j) {
      const float4 add = slots[j * kWarpSize];
      s[j][0] = fmaf(s[j][0], qk_scale, add.x);
      s[j][1] = fmaf(s[j][1], qk_scale, add.y);
      s[j][2] = fmaf(s[j][2], qk_scale, add.z);
      s[j][3] = fmaf(s[j][3], qk_scale, add.w);
      high0 = fmaxf(high0, fmaxf(s[j][0], s[j][1]));
      high1 = fmaxf(high1, fmaxf(s[j][2], s[j][3]));
    }
    float shift0, shift1, sum0, sum1;
    exponentiate_rows(s, high0, high1, shift0, shift1, sum0, sum1);
    const size_t window = static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k;
    if (t == 0) {
      // +inf for a row with no key: the backward's exp(S - lse) is then 0 there.
      float* lse_rows = lse + (window * heads + h) * N;
      lse_rows[row + g] = sum0 > 0.f ? (shift0 + log2f(sum0)) * kLn2 : INFINITY;
      lse_rows[row + g + 8] = sum1 > 0.f ? (shift1 + log2f(sum1)) * kLn2 : INFINITY;
    }

    // O = P V, P normalised as it is packed into A fragments.
    const float f0 = sum0 > 0.f ? 1.f / sum0 : 0.f, f1 = sum1 > 0.f ? 1.f / sum1 : 0.f;
    float o[C::kDimTiles][4] = {};
#pragma unroll
    for (int kc = 0; kc < C::kSteps; ++kc) {
      uint32_t a[4];
      accumulators_as_a<T>(a, s[2 * kc], s[2 * kc + 1], f0, f1);
      fragment_times_rows<T, D>(o, a, q + 2 * C::kTile + 16 * kc * C::kLd, lane);
    }
    store_row_fragments<T, C::kDimTiles>(o, out + window * N * out_stride + h * D, out_stride, row, 1.f, g, t);
    __syncthreads();  // the stage is refilled with window k + 2
  }
}

template <class T, int D>
__global__ void __launch_bounds__(LargeWindow<T, D>::kThreads, 1)
    window_attention_backward_large_kernel(const T* __restrict__ qkv, const float* __restrict__ bias,
                                           const float* __restrict__ mask, const T* __restrict__ out,
                                           const float* __restrict__ lse, const T* __restrict__ dout,
                                           T* __restrict__ dqkv, float* __restrict__ partials, int heads,
                                           WindowDeal deal, float scale) {
  using C = LargeWindow<T, D>;
  constexpr int N = C::kN, kStages = C::kBackwardStages;
  extern __shared__ __align__(128) unsigned char shared[];
  T* tiles = reinterpret_cast<T*>(shared);  // [stage][Q, K, V, dO][kN][kLd]
  unsigned char* after_tiles = shared + kStages * C::kBackwardTiles * C::kTileBytes;
  float4* table = reinterpret_cast<float4*>(after_tiles);
  T* ds_t = reinterpret_cast<T*>(after_tiles + C::kTableBytes);                          // dS^T [key][query]
  T* o_tile = reinterpret_cast<T*>(after_tiles + C::kTableBytes + C::kTransposedBytes);  // O [query][D]
  float* row_lse = reinterpret_cast<float*>(after_tiles + C::kTableBytes + C::kTransposedBytes + C::kOutBytes);
  float* row_d = row_lse + kStages * N;  // row_lse: [stage][kN]
  const WindowDeal::Block block = deal.block(blockIdx.x);
  const int h = block.h, m = block.m, part = block.part, first = block.first, last = block.last;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int row = 16 * warp;  // the warp's keys (and its queries for dQ)
  const size_t qkv_stride = 3 * static_cast<size_t>(heads) * D, out_stride = static_cast<size_t>(heads) * D;

  // Q, K, V, dO and lse of window k into `stage`, O into its one buffer (read before the next fetch).
  auto fetch = [&](int k, int stage) {
    const size_t window = static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k;
    const T* source = qkv + window * N * qkv_stride + h * D;
    T* tile = tiles + stage * C::kBackwardTiles * C::kTile;
    copy_window_async<T, D>(tile, source, qkv_stride);
    copy_window_async<T, D>(tile + C::kTile, source + heads * D, qkv_stride);
    copy_window_async<T, D>(tile + 2 * C::kTile, source + 2 * heads * D, qkv_stride);
    copy_window_async<T, D>(tile + 3 * C::kTile, dout + window * N * out_stride + h * D, out_stride);
    copy_window_async<T, D, D>(o_tile, out + window * N * out_stride + h * D, out_stride);
    if (threadIdx.x < N) copy_async4(row_lse + stage * N + threadIdx.x, lse + (window * heads + h) * N + threadIdx.x);
    copy_async_commit();
  };
  fetch(first, 0);

  // This thread's (bias + mask) log2 e at its S^T positions: keys row + g (elements 0, 1) and
  // row + g + 8 (2, 3), queries 8j + 2t (+1); bias and mask are [query][key].
  float4* slots = table + warp * C::kTiles * kWarpSize + lane;
  store_window_bias<C, true>(slots, bias + static_cast<size_t>(h) * N * N,
                             mask ? mask + static_cast<size_t>(m) * N * N : nullptr, row + g, t);
  float dbias[C::kTiles][4] = {};  // dS^T at this thread's positions, summed over the block's windows
  const float qk_scale = scale * kLog2e;

  for (int k = first; k < last; ++k) {
    const int stage = kStages == 2 ? (k - first) & 1 : 0;
    copy_async_wait<0>();  // window k's group is the only one in flight
    __syncthreads();
    const T* q = tiles + stage * C::kBackwardTiles * C::kTile;
    const T* key = q + C::kTile;
    const T* value = q + 2 * C::kTile;
    const T* grad = q + 3 * C::kTile;
    const float* lse_rows = row_lse + stage * N;
    const size_t window = static_cast<size_t>(m) + static_cast<size_t>(deal.mask_windows) * k;

    // D_i = dO_i . O_i in float: lanes kVecs apart share a row, 8 elements each.
    {
      constexpr int kVecs = D / 8;
      static_assert(N * kVecs % C::kThreads == 0 && kWarpSize % kVecs == 0, "whole rows per lane group");
#pragma unroll
      for (int x = 0; x < N * kVecs / C::kThreads; ++x) {
        const int e = threadIdx.x + x * C::kThreads, r = e / kVecs, c = e % kVecs * 8;
        const Vec<T, 8> o = Vec<T, 8>::load(o_tile + r * D + c);
        const Vec<T, 8> d = Vec<T, 8>::load(grad + r * C::kLd + c);
        float dot = 0.f;
#pragma unroll
        for (int y = 0; y < 8; ++y) dot += to_float(o.v[y]) * to_float(d.v[y]);
        dot = lane_group_sum<kVecs>(dot);
        if (c == 0) row_d[r] = dot;
      }
    }
    __syncthreads();  // D complete; O's buffer is free
    if (kStages == 2 && k + 1 < last) fetch(k + 1, stage ^ 1);

    // Passes over the queries: S^T = K Q^T and dP^T = V dO^T for the warp's keys; P^T = exp(S^T -
    // lse) recomputed in float; dS^T = P^T (dP^T - D), summed into dbias and written to dS^T in T;
    // dV += P^T dO with P^T straight from the accumulators.
    float dv[C::kDimTiles][4] = {};
#pragma unroll
    for (int pass = 0; pass < N / C::kPass; ++pass) {
      const int query0 = pass * C::kPass;
      float p[C::kPassTiles][4], ds[C::kPassTiles][4];
#pragma unroll
      for (int j = 0; j < C::kPassTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[j][e] = ds[j][e] = 0.f;
      }
      multiply_transposed<T, D, C::kPassTiles>(p, key + row * C::kLd, q + query0 * C::kLd, lane);
      multiply_transposed<T, D, C::kPassTiles>(ds, value + row * C::kLd, grad + query0 * C::kLd, lane);
#pragma unroll
      for (int j = 0; j < C::kPassTiles; ++j) {
        const int tile = pass * C::kPassTiles + j, query = 8 * tile + 2 * t;
        const float4 add = slots[tile * kWarpSize];
        const float2 l = *reinterpret_cast<const float2*>(lse_rows + query);
        const float2 d = *reinterpret_cast<const float2*>(row_d + query);
        const float l0 = l.x * kLog2e, l1 = l.y * kLog2e;
        p[j][0] = exp2f(fmaf(p[j][0], qk_scale, add.x) - l0);
        p[j][1] = exp2f(fmaf(p[j][1], qk_scale, add.y) - l1);
        p[j][2] = exp2f(fmaf(p[j][2], qk_scale, add.z) - l0);
        p[j][3] = exp2f(fmaf(p[j][3], qk_scale, add.w) - l1);
        ds[j][0] = p[j][0] * (ds[j][0] - d.x);
        ds[j][1] = p[j][1] * (ds[j][1] - d.y);
        ds[j][2] = p[j][2] * (ds[j][2] - d.x);
        ds[j][3] = p[j][3] * (ds[j][3] - d.y);
#pragma unroll
        for (int e = 0; e < 4; ++e) dbias[tile][e] += ds[j][e];
        *reinterpret_cast<uint32_t*>(ds_t + (row + g) * C::kLdTransposed + query) = pack_pair<T>(ds[j][0], ds[j][1]);
        *reinterpret_cast<uint32_t*>(ds_t + (row + g + 8) * C::kLdTransposed + query) =
            pack_pair<T>(ds[j][2], ds[j][3]);
      }
#pragma unroll
      for (int kc = 0; kc < C::kPass / 16; ++kc) {
        uint32_t a[4];
        accumulators_as_a<T>(a, p[2 * kc], p[2 * kc + 1], 1.f, 1.f);
        fragment_times_rows<T, D>(dv, a, grad + (query0 + 16 * kc) * C::kLd, lane);
      }
    }
    T* d_rows = dqkv + window * N * qkv_stride + h * D;
    store_row_fragments<T, C::kDimTiles>(dv, d_rows + 2 * heads * D, qkv_stride, row, 1.f, g, t);
    __syncthreads();  // dS^T complete

    // dK = scale dS^T Q for the warp's keys (A: dS^T's rows, plain ldmatrix) and dQ = scale dS K for
    // queries row..row + 15 (A: dS through transposed ldmatrix, matrix i = lane / 8 being keys
    // 8 (i / 2).., queries 8 (i % 2)..).
    {
      float dk[C::kDimTiles][4] = {};
      const T* a_lane = ds_t + (row + (lane & 15)) * C::kLdTransposed + (lane >> 4) * 8;
#pragma unroll
      for (int kc = 0; kc < C::kSteps; ++kc) {
        uint32_t a[4];
        load_matrix_x4(a, shared_address(a_lane + 16 * kc));
        fragment_times_rows<T, D>(dk, a, q + 16 * kc * C::kLd, lane);
      }
      store_row_fragments<T, C::kDimTiles>(dk, d_rows + heads * D, qkv_stride, row, scale, g, t);
    }
    {
      float dq[C::kDimTiles][4] = {};
      const T* a_lane = ds_t + ((lane & 7) + (lane >> 4) * 8) * C::kLdTransposed + row + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int kc = 0; kc < C::kSteps; ++kc) {
        uint32_t a[4];
        load_matrix_x4_transposed(a, shared_address(a_lane + 16 * kc * C::kLdTransposed));
        fragment_times_rows<T, D>(dq, a, key + 16 * kc * C::kLd, lane);
      }
      store_row_fragments<T, C::kDimTiles>(dq, d_rows, qkv_stride, row, scale, g, t);
    }
    __syncthreads();  // the stage is refilled (window k + 2, or k + 1 with one stage); dS^T rewritten
    if (kStages == 1 && k + 1 < last) fetch(k + 1, 0);
  }

  // This block's sum of dS over its windows into its own slice (m * parts + part) of the workspace.
  float* partial = partials + ((static_cast<size_t>(m) * deal.parts + part) * heads + h) * static_cast<size_t>(N) * N;
#pragma unroll
  for (int j = 0; j < C::kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      partial[(8 * j + 2 * t + (e & 1)) * N + (e < 2 ? row + g : row + g + 8)] = dbias[j][e];
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

// How the backward deals the windows of a shape to its blocks.
template <class T, int N, int D>
WindowDeal backward_deal(const WindowAttentionShape& s) {
  if constexpr (N == SmallWindow<T, D>::kN) {
    return deal_windows(s, SmallWindow<T, D>::kBackwardChunk);
  } else {
    return deal_windows(s, LargeWindow<T, D>::kBackwardChunk);
  }
}

// Slices of the backward's bias-gradient workspace per head: one per block of a head (mask windows
// x parts).
template <class T, int N, int D>
int backward_slices(const WindowAttentionShape& s) {
  if (s.windows == 0) return 0;
  const WindowDeal deal = backward_deal<T, N, D>(s);
  return deal.mask_windows * deal.parts;
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
      using L = LargeWindow<T, D>;
      const WindowDeal deal = deal_windows(s, L::kForwardChunk);
      allow_shared<window_attention_forward_large_kernel<T, D>>(L::kForwardBytes);
      window_attention_forward_large_kernel<T, D><<<deal.blocks(s.heads), L::kThreads, L::kForwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<T*>(out), lse, s.heads,
          deal, scale);
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
    const int slices = backward_slices<T, N, D>(s);
    float* partials = static_cast<float*>(workspace);
    float* dbias = partials + static_cast<size_t>(slices) * s.heads * pairs;
    if (slices > 0) {
      const WindowDeal deal = backward_deal<T, N, D>(s);
      if constexpr (N == SmallWindow<T, D>::kN) {
        using S = SmallWindow<T, D>;
        allow_shared<window_attention_backward_small_kernel<T, D>>(S::kBackwardBytes);
        window_attention_backward_small_kernel<T, D><<<deal.blocks(s.heads), S::kThreads, S::kBackwardBytes, stream>>>(
            static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, lse, static_cast<const T*>(dout),
            static_cast<T*>(dqkv), partials, s.heads, deal, scale);
      } else {
        using L = LargeWindow<T, D>;
        allow_shared<window_attention_backward_large_kernel<T, D>>(L::kBackwardBytes);
        window_attention_backward_large_kernel<T, D><<<deal.blocks(s.heads), L::kThreads, L::kBackwardBytes, stream>>>(
            static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<const T*>(out), lse,
            static_cast<const T*>(dout), static_cast<T*>(dqkv), partials, s.heads, deal, scale);
      }
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
