// Swin window attention for 144-token windows (window 12): forward and backward, scores in
// registers, bias + mask in shared memory.
//
// As for 49 tokens, a block works through `chunk` windows of one head h and one mask window m, with
// Q, K, V (and dO) of the next window copied into a second shared-memory stage while the current
// one is computed. 144 = 9 x 16 needs no padding: 9 warps, warp w owns rows 16w..16w+15. A thread's
// 16 x 144 share of S is 72 floats, so its 72 values of (bias + mask) log2 e cannot stay in
// registers as well: the block writes them once, in float, to a shared-memory table laid out in
// fragment order ([warp][8-column tile][lane] float4), from which every window reads them back with
// one conflict-free 16-byte load per tile. Only the thread that wrote a slot reads it. (In T the
// table would lose the bias next to a -100 mask entry, and in bf16 the bias itself.)
// Operands come from shared memory through ldmatrix (kernels/detail/mma_fragments.cuh).
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
#pragma once

#include "kernels/detail/mma_fragments.cuh"
#include "kernels/detail/window_attention_common.cuh"

namespace fusekit::kernels {
// Included by window_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

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

// The A fragment of a 16x16 block from two side-by-side accumulator tiles (kernels/detail/mma_fragments.cuh).
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

}  // namespace
}  // namespace fusekit::kernels
