// The linear layer for skinny shapes: K, N <= 64 (Swin's 49-token window GEMMs), unpadded with a
// feature size that is not a multiple of 8, where every row is only 2-byte aligned and cuBLASLt runs
// its align-1 kernels, or padded (run over the padded extents; evidence/h100/notes/linear.md has the numbers). The
// GEMMs are memory bound, so the kernels are built around the bytes:
//
//   forward:  y = x W^T + b
//   backward: dx = dy W,  dW = dy^T x,  db = sum_rows(dy)
//
// x: [M, K], W: [N, K], b: [N], y, dy: [M, N], dx: [M, K], row-major and dense. A tile of R
// consecutive rows (R * sizeof(T) a multiple of 16 bytes: 256 or 128 rows of 16-bit types, 64 of
// fp32) is one contiguous byte range of x, of y, of dy and of dx, and with a 16-byte aligned base
// every tile's range starts 16-byte aligned whatever K and N are.
// So a block copies whole tiles with 16-byte vectors (cp.async, double-buffered: the next tile loads
// while this one computes), the last tile's tail element by element, into shared memory, where the
// rows sit densely packed (row r at r * K); the mma fragments are gathered from there with 16-bit
// loads, zero outside the matrix. Outputs are staged the same way and leave as 16-byte vectors.
// A base that is not 16-byte aligned falls back to element copies (a run-time flag, same kernel).
//
// fp16/bf16: mma.sync m16n8k16 with float accumulators; the weight, zero-padded to K_pad, N_pad in
// {32, 64} (template parameters), sits in shared memory in fragment order (one 8-byte load per lane
// per mma). fp32: plain FMA (never TF32), the weight in shared memory.
//
// Backward: one kernel reads each tile of dy and x once and writes dx for the tile, while every
// block accumulates dW and db for the rows it visited in registers (dW with mma over the tile's rows,
// db as the product of dy^T with a column of ones); each block writes its partial sums once, and
// layernorm_rows::parameter_gradient_kernel adds the blocks' partials in a fixed order: no atomics,
// and the same bits on every run on one device (the rows' split into partials follows the grid: one
// wave of resident blocks, so the device's multiprocessor count and occupancy).
#include "kernels/detail/skinny_linear.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/layernorm_common.cuh"
#include "kernels/detail/mma_fragments.cuh"

namespace fusekit::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
// Rows per tile: R * sizeof(T) a multiple of 16, so that every tile's byte range starts 16-byte aligned.
constexpr int kForwardTileRows16 = 256;  // fp16/bf16 forward: 8 warps x 2 m-tiles of 16 rows
constexpr int kBackwardTileRows16 = 128;
constexpr int kTileRows32 = 64;  // fp32

// ---- CUDA kernels

// Elements of T in a shared buffer for `count` elements, rounded up to 16 bytes (keeps the next one aligned).
template <class T>
__host__ __device__ constexpr int stage_elements(int count) {
  constexpr int kVec = 16 / sizeof(T);
  return (count + kVec - 1) / kVec * kVec;
}

// count elements global -> shared (dst 16-byte aligned): 16-byte cp.async where `vector` (src 16-byte
// aligned), the tail (and everything otherwise) element by element. Complete after
// copy_async_commit + copy_async_wait + __syncthreads.
template <class T>
__device__ __forceinline__ void load_range_async(T* dst, const T* __restrict__ src, int count, bool vector) {
  constexpr int kVec = 16 / sizeof(T);
  int done = 0;
  if (vector) {
    done = count / kVec * kVec;
    for (int i = threadIdx.x * kVec; i < done; i += blockDim.x * kVec) copy_async16(dst + i, src + i);
  }
  for (int i = done + threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
}

// count elements shared (16-byte aligned) -> global, as load_range_async.
template <class T>
__device__ __forceinline__ void store_range(T* __restrict__ dst, const T* src, int count, bool vector) {
  constexpr int kVec = 16 / sizeof(T);
  int done = 0;
  if (vector) {
    done = count / kVec * kVec;
    for (int i = threadIdx.x * kVec; i < done; i += blockDim.x * kVec)
      *reinterpret_cast<int4*>(dst + i) = *reinterpret_cast<const int4*>(src + i);
  }
  for (int i = done + threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
}

// Two 16-bit elements of a shared tile packed low | high << 16, each zero where its flag is false
// (outside the matrix: the rows are densely packed, so a column past the end is the next row's).
__device__ __forceinline__ uint32_t gather_pair(const uint16_t* s, int low, bool low_in, int high, bool high_in) {
  const uint32_t l = low_in ? s[low] : 0u, h = high_in ? s[high] : 0u;
  return l | h << 16;
}

__device__ __forceinline__ uint32_t element_bits(const uint16_t* __restrict__ p, int i, bool in) {
  return in ? p[i] : 0u;
}

// One row times a matrix held as float4 groups of 4 columns, in fp32 with FMA: out[4 g + e] =
// acc_e + sum over k < inner of row[k] * matrix[k * groups + g].e, stored where 4 g + e < columns.
__device__ __forceinline__ void row_times_matrix4(const float* row, const float4* matrix, int inner, int groups, int g,
                                                  float4 acc, float* out, int columns) {
#pragma unroll 4
  for (int k = 0; k < inner; ++k) {
    const float v = row[k];
    const float4 w = matrix[k * groups + g];
    acc.x = fmaf(v, w.x, acc.x);
    acc.y = fmaf(v, w.y, acc.y);
    acc.z = fmaf(v, w.z, acc.z);
    acc.w = fmaf(v, w.w, acc.w);
  }
  const float values[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (g * 4 + e < columns) out[g * 4 + e] = values[e];
  }
}

// Walks the block's tiles (blockIdx.x, + gridDim.x, ...) through two shared-memory stages: the next
// tile's copies (load(row0, rows, stage), cp.async) are in flight while body(tile, stage, rows)
// computes on this one. body must end with a __syncthreads() before it returns (the stage it read
// is the next load's target).
template <class Load, class Body>
__device__ __forceinline__ void walk_tiles(int M, int tile_rows, Load&& load, Body&& body) {
  const int tiles = ceil_div(M, tile_rows);
  auto load_tile = [&](int tile, int stage) {
    load(static_cast<size_t>(tile) * tile_rows, min(tile_rows, M - tile * tile_rows), stage);
  };
  int tile = blockIdx.x;
  if (tile < tiles) load_tile(tile, 0);
  copy_async_commit();
  for (int stage = 0; tile < tiles; tile += gridDim.x, stage ^= 1) {
    if (tile + gridDim.x < tiles) load_tile(tile + gridDim.x, stage ^ 1);
    copy_async_commit();
    copy_async_wait<1>();
    __syncthreads();  // this tile's stage (and, the first time, what the block staged before) visible to all
    body(tile, stage, min(tile_rows, M - tile * tile_rows));
  }
}

// One warp's 16 rows (r0 = m0 + g, r1 = r0 + 8) of a packed shared tile (row stride `inner`) times
// the B fragments of a resident matrix: acc[j] += A(16 x 16 at column 16 kt) B(kt, j) for kt < KT,
// j < NT, fragment (kt, j) at fragments[(kt * NT + j) * 32 + lane]. Columns past `inner` are zero.
template <class T, int KT, int NT>
__device__ __forceinline__ void rows_times_fragments(float (&acc)[NT][4], const uint16_t* tile, int inner, int r0,
                                                     int r1, int t, const uint2* fragments, int lane) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
    const int c = kt * 16 + 2 * t;
    const bool c0 = c < inner, c1 = c + 1 < inner, c8 = c + 8 < inner, c9 = c + 9 < inner;
    const uint32_t a[4] = {gather_pair(tile, r0 * inner + c, c0, r0 * inner + c + 1, c1),
                           gather_pair(tile, r1 * inner + c, c0, r1 * inner + c + 1, c1),
                           gather_pair(tile, r0 * inner + c + 8, c8, r0 * inner + c + 9, c9),
                           gather_pair(tile, r1 * inner + c + 8, c8, r1 * inner + c + 9, c9)};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint2 b = fragments[(kt * NT + j) * kWarpSize + lane];
      mma_16816<T>(acc[j], a, b.x, b.y);
    }
  }
}

// Writes the accumulators of rows r0, r1 into a packed shared stage of `columns` columns (plus
// add[j][0..1] where kAdd: the bias), converted to T; columns past the end are dropped.
template <class T, int NT, bool kAdd>
__device__ __forceinline__ void stage_fragment_rows(T* stage, int columns, int r0, int r1, int t,
                                                    const float (&acc)[NT][4], const float (&add)[NT][2]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = j * 8 + 2 * t;
    const float a0 = kAdd ? add[j][0] : 0.f, a1 = kAdd ? add[j][1] : 0.f;
    if (n < columns) {
      stage[r0 * columns + n] = from_float<T>(kAdd ? acc[j][0] + a0 : acc[j][0]);
      stage[r1 * columns + n] = from_float<T>(kAdd ? acc[j][2] + a0 : acc[j][2]);
    }
    if (n + 1 < columns) {
      stage[r0 * columns + n + 1] = from_float<T>(kAdd ? acc[j][1] + a1 : acc[j][1]);
      stage[r1 * columns + n + 1] = from_float<T>(kAdd ? acc[j][3] + a1 : acc[j][3]);
    }
  }
}

// y = x W^T + b, fp16/bf16. Warp w computes the m-tiles w, w + 8, ... (16 rows each) of every tile
// its block visits, all N_pad columns: acc[j] is columns 8j .. 8j + 7.
template <class T, int KP, int NP>
__global__ void __launch_bounds__(kThreads, 2)
    skinny_forward_mma_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                              T* __restrict__ y, int M, int N, int K, int tile_rows, bool vector_x, bool vector_y) {
  constexpr int KT = KP / 16, NT = NP / 8;
  extern __shared__ uint4 shared[];
  uint2* w_fragments = reinterpret_cast<uint2*>(shared);  // [KT][NT][lane]: the B fragments of W^T
  T* x_stages = reinterpret_cast<T*>(w_fragments + KT * NT * kWarpSize);
  const int x_elements = stage_elements<T>(tile_rows * K);
  T* y_stage = x_stages + 2 * x_elements;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, g = lane / 4, t = lane % 4;
  const uint16_t* w16 = reinterpret_cast<const uint16_t*>(weight);
  for (int i = threadIdx.x; i < KT * NT * kWarpSize; i += blockDim.x) {
    const int l = i % kWarpSize, kt = i / kWarpSize / NT, j = i / kWarpSize % NT;
    const int n = j * 8 + l / 4, k = kt * 16 + 2 * (l % 4);  // B[k][n] = W[n][k]
    auto w = [&](int kk) { return element_bits(w16, n * K + kk, n < N && kk < K); };
    w_fragments[i] = make_uint2(w(k) | w(k + 1) << 16, w(k + 8) | w(k + 9) << 16);
  }
  float bias_pair[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = j * 8 + 2 * t;
    bias_pair[j][0] = n < N ? to_float(bias[n]) : 0.f;
    bias_pair[j][1] = n + 1 < N ? to_float(bias[n + 1]) : 0.f;
  }

  walk_tiles(
      M, tile_rows,
      [&](size_t row0, int rows, int stage) {
        load_range_async(x_stages + stage * x_elements, x + row0 * K, rows * K, vector_x);
      },
      [&](int tile, int stage, int rows) {
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(x_stages + stage * x_elements);
        for (int m0 = warp * 16; m0 < rows; m0 += kWarps * 16) {
          const int r0 = m0 + g, r1 = r0 + 8;
          float acc[NT][4] = {};
          rows_times_fragments<T, KT, NT>(acc, xs, K, r0, r1, t, w_fragments, lane);
          // Rows past the tile's end are computed from stale shared memory and never leave the stage.
          stage_fragment_rows<T, NT, true>(y_stage, N, r0, r1, t, acc, bias_pair);
        }
        __syncthreads();  // y_stage complete; also: every warp is done with this x stage
        store_range(y + static_cast<size_t>(tile) * tile_rows * N, y_stage, rows * N, vector_y);
      });
}

// dx = dy W, dW and db partials, fp16/bf16. dx as the forward (A = dy, k over N). dW [N_pad, K_pad]
// is NS x KJ mma tiles of 16 x 8; warp w owns m-tile w % NS and n-tiles w / NS + i * (8 / NS), and
// runs the k loop of its tiles over the rows of each tile: A = dy^T, B = x. The warps that own n-tile
// 0 also multiply their A by ones: db.
template <class T, int KP, int NP>
__global__ void __launch_bounds__(kThreads, 2)
    skinny_backward_mma_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                               T* __restrict__ dx, float* __restrict__ dweight_partial,
                               float* __restrict__ dbias_partial, int M, int N, int K, int tile_rows, bool vector_dy,
                               bool vector_x, bool vector_dx) {
  constexpr int NS = NP / 16, KJ = KP / 8;
  constexpr int kStride = kWarps / NS, kOwned = NS * KJ / kWarps;
  static_assert(NS * KJ % kWarps == 0 && kWarps % NS == 0, "dW tiles must split evenly over the warps");
  extern __shared__ uint4 shared[];
  uint2* w_fragments = reinterpret_cast<uint2*>(shared);  // [NS][KJ][lane]: the B fragments of W
  T* dy_stages = reinterpret_cast<T*>(w_fragments + NS * KJ * kWarpSize);
  const int dy_elements = stage_elements<T>(tile_rows * N), x_elements = stage_elements<T>(tile_rows * K);
  T* x_stages = dy_stages + 2 * dy_elements;
  T* dx_stage = x_stages + 2 * x_elements;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, g = lane / 4, t = lane % 4;
  const uint16_t* w16 = reinterpret_cast<const uint16_t*>(weight);
  for (int i = threadIdx.x; i < NS * KJ * kWarpSize; i += blockDim.x) {
    const int l = i % kWarpSize, ns = i / kWarpSize / KJ, j = i / kWarpSize % KJ;
    const int n = ns * 16 + 2 * (l % 4), k = j * 8 + l / 4;  // B[n][k] = W[n][k]
    auto w = [&](int nn) { return element_bits(w16, nn * K + k, nn < N && k < K); };
    w_fragments[i] = make_uint2(w(n) | w(n + 1) << 16, w(n + 8) | w(n + 9) << 16);
  }
  const int own_m = warp % NS, own_j = warp / NS;
  const int n0 = own_m * 16 + g, n1 = n0 + 8;  // the rows of dW (and db) in this lane's fragments
  const uint32_t ones = pack_pair<T>(1.f, 1.f);
  float dw_acc[kOwned][4] = {};
  float db_acc[4] = {};

  walk_tiles(
      M, tile_rows,
      [&](size_t row0, int rows, int stage) {
        load_range_async(dy_stages + stage * dy_elements, dy + row0 * N, rows * N, vector_dy);
        load_range_async(x_stages + stage * x_elements, x + row0 * K, rows * K, vector_x);
      },
      [&](int tile, int stage, int rows) {
        const uint16_t* dys = reinterpret_cast<const uint16_t*>(dy_stages + stage * dy_elements);
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(x_stages + stage * x_elements);

        if (dx != nullptr) {
          for (int m0 = warp * 16; m0 < rows; m0 += kWarps * 16) {
            const int r0 = m0 + g, r1 = r0 + 8;
            float acc[KJ][4] = {};
            rows_times_fragments<T, NS, KJ>(acc, dys, N, r0, r1, t, w_fragments, lane);
            const float none[KJ][2] = {};
            stage_fragment_rows<T, KJ, false>(dx_stage, K, r0, r1, t, acc, none);
          }
        }

        // dW += dy^T x over the tile's rows, 16 at a time; rows past the tile's end are zero.
        for (int r = 0; r < rows; r += 16) {
          const int ra = r + 2 * t, rb = ra + 8;
          const bool a0 = ra < rows, a1 = ra + 1 < rows, b0 = rb < rows, b1 = rb + 1 < rows;
          const uint32_t a[4] = {gather_pair(dys, ra * N + n0, a0 && n0 < N, (ra + 1) * N + n0, a1 && n0 < N),
                                 gather_pair(dys, ra * N + n1, a0 && n1 < N, (ra + 1) * N + n1, a1 && n1 < N),
                                 gather_pair(dys, rb * N + n0, b0 && n0 < N, (rb + 1) * N + n0, b1 && n0 < N),
                                 gather_pair(dys, rb * N + n1, b0 && n1 < N, (rb + 1) * N + n1, b1 && n1 < N)};
#pragma unroll
          for (int i = 0; i < kOwned; ++i) {
            const int k = (own_j + i * kStride) * 8 + g;
            const bool in = k < K;
            const uint32_t x0 = gather_pair(xs, ra * K + k, a0 && in, (ra + 1) * K + k, a1 && in);
            const uint32_t x1 = gather_pair(xs, rb * K + k, b0 && in, (rb + 1) * K + k, b1 && in);
            mma_16816<T>(dw_acc[i], a, x0, x1);
          }
          if (own_j == 0) mma_16816<T>(db_acc, a, ones, ones);  // warp-uniform
        }
        __syncthreads();  // dx_stage complete; every warp done with this stage of dy and x
        if (dx != nullptr) store_range(dx + static_cast<size_t>(tile) * tile_rows * K, dx_stage, rows * K, vector_dx);
      });

  // This block's partial sums: C fragment rows n0, n1, columns k, k + 1.
  float* partial = dweight_partial + static_cast<size_t>(blockIdx.x) * N * K;
#pragma unroll
  for (int i = 0; i < kOwned; ++i) {
    const int k = (own_j + i * kStride) * 8 + 2 * t;
    if (n0 < N && k < K) partial[n0 * K + k] = dw_acc[i][0];
    if (n0 < N && k + 1 < K) partial[n0 * K + k + 1] = dw_acc[i][1];
    if (n1 < N && k < K) partial[n1 * K + k] = dw_acc[i][2];
    if (n1 < N && k + 1 < K) partial[n1 * K + k + 1] = dw_acc[i][3];
  }
  if (dbias_partial != nullptr && own_j == 0 && t == 0) {
    float* bias_partial = dbias_partial + static_cast<size_t>(blockIdx.x) * N;
    if (n0 < N) bias_partial[n0] = db_acc[0];
    if (n1 < N) bias_partial[n1] = db_acc[2];
  }
}

// y = x W^T + b, fp32 with FMA: a thread computes one row x 4 columns at a time (W^T in shared
// memory as [K][NG] float4, NG = ceil(N / 4), zero past N).
__global__ void __launch_bounds__(kThreads)
    skinny_forward_fma_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                              const float* __restrict__ bias, float* __restrict__ y, int M, int N, int K, int tile_rows,
                              bool vector_x, bool vector_y) {
  extern __shared__ uint4 shared[];
  const int NG = ceil_div(N, 4);
  float4* wt = reinterpret_cast<float4*>(shared);  // [K][NG]
  float4* bias4 = wt + K * NG;                     // [NG]
  float* x_stages = reinterpret_cast<float*>(bias4 + NG);
  const int x_elements = stage_elements<float>(tile_rows * K);
  float* y_stage = x_stages + 2 * x_elements;

  float* wt_flat = reinterpret_cast<float*>(wt);
  for (int i = threadIdx.x; i < K * NG * 4; i += blockDim.x) {
    const int k = i / (NG * 4), n = i % (NG * 4);
    wt_flat[i] = n < N ? weight[n * K + k] : 0.f;
  }
  float* bias_flat = reinterpret_cast<float*>(bias4);
  for (int n = threadIdx.x; n < NG * 4; n += blockDim.x) bias_flat[n] = n < N ? bias[n] : 0.f;

  walk_tiles(
      M, tile_rows,
      [&](size_t row0, int rows, int stage) {
        load_range_async(x_stages + stage * x_elements, x + row0 * K, rows * K, vector_x);
      },
      [&](int tile, int stage, int rows) {
        const float* xs = x_stages + stage * x_elements;
        for (int i = threadIdx.x; i < rows * NG; i += blockDim.x) {
          const int r = i / NG, cg = i % NG;
          row_times_matrix4(xs + r * K, wt, K, NG, cg, bias4[cg], y_stage + r * N, N);
        }
        __syncthreads();
        store_range(y + static_cast<size_t>(tile) * tile_rows * N, y_stage, rows * N, vector_y);
      });
}

// dx = dy W, dW and db partials, fp32 with FMA. dx: a thread computes one row x 4 columns at a
// time (W in shared memory as [N][KG] float4). dW: thread i < NG * KG owns the 4 x 4 block of rows
// 4 (i / KG) and columns 4 (i % KG) for the whole kernel; those of column block 0 also own db.
__global__ void __launch_bounds__(kThreads)
    skinny_backward_fma_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                               const float* __restrict__ weight, float* __restrict__ dx,
                               float* __restrict__ dweight_partial, float* __restrict__ dbias_partial, int M, int N,
                               int K, int tile_rows, bool vector_dy, bool vector_x, bool vector_dx) {
  extern __shared__ uint4 shared[];
  const int KG = ceil_div(K, 4), NG = ceil_div(N, 4);
  float4* w4 = reinterpret_cast<float4*>(shared);  // [N][KG]
  float* dy_stages = reinterpret_cast<float*>(w4 + N * KG);
  const int dy_elements = stage_elements<float>(tile_rows * N), x_elements = stage_elements<float>(tile_rows * K);
  float* x_stages = dy_stages + 2 * dy_elements;
  float* dx_stage = x_stages + 2 * x_elements;

  float* w_flat = reinterpret_cast<float*>(w4);
  for (int i = threadIdx.x; i < N * KG * 4; i += blockDim.x) {
    const int n = i / (KG * 4), k = i % (KG * 4);
    w_flat[i] = k < K ? weight[n * K + k] : 0.f;
  }
  const int own = threadIdx.x, own_n = own / KG * 4, own_k = own % KG * 4;
  const bool owner = own < NG * KG;
  float dw_acc[4][4] = {};
  float db_acc[4] = {};

  walk_tiles(
      M, tile_rows,
      [&](size_t row0, int rows, int stage) {
        load_range_async(dy_stages + stage * dy_elements, dy + row0 * N, rows * N, vector_dy);
        load_range_async(x_stages + stage * x_elements, x + row0 * K, rows * K, vector_x);
      },
      [&](int tile, int stage, int rows) {
        const float* dys = dy_stages + stage * dy_elements;
        const float* xs = x_stages + stage * x_elements;
        if (dx != nullptr) {
          for (int i = threadIdx.x; i < rows * KG; i += blockDim.x) {
            const int r = i / KG, kg = i % KG;
            row_times_matrix4(dys + r * N, w4, N, KG, kg, make_float4(0.f, 0.f, 0.f, 0.f), dx_stage + r * K, K);
          }
        }
        if (owner) {
          for (int r = 0; r < rows; ++r) {
            float d[4], v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              d[e] = own_n + e < N ? dys[r * N + own_n + e] : 0.f;
              v[e] = own_k + e < K ? xs[r * K + own_k + e] : 0.f;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              db_acc[e] += d[e];
#pragma unroll
              for (int f = 0; f < 4; ++f) dw_acc[e][f] = fmaf(d[e], v[f], dw_acc[e][f]);
            }
          }
        }
        __syncthreads();
        if (dx != nullptr) store_range(dx + static_cast<size_t>(tile) * tile_rows * K, dx_stage, rows * K, vector_dx);
      });

  if (owner) {
    float* partial = dweight_partial + static_cast<size_t>(blockIdx.x) * N * K;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        if (own_n + e < N && own_k + f < K) partial[(own_n + e) * K + own_k + f] = dw_acc[e][f];
      }
    }
    if (dbias_partial != nullptr && own_k == 0) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (own_n + e < N) dbias_partial[static_cast<size_t>(blockIdx.x) * N + own_n + e] = db_acc[e];
      }
    }
  }
}

// ---- kernel launchers

// Calls FN with the compile-time padded sizes K_pad, N_pad in {32, 64}.
template <class FN>
void dispatch_padded_sizes(int K, int N, FN&& fn) {
  static_assert(kSkinnyMaxFeatures <= 64, "the kernels are instantiated for padded sizes 32 and 64 only");
  if (K > 64 || N > 64) throw std::logic_error("linear: no skinny kernel for features past 64");
  using k32 = std::integral_constant<int, 32>;
  using k64 = std::integral_constant<int, 64>;
  if (K <= 32 && N <= 32)
    fn(k32{}, k32{});
  else if (K <= 32)
    fn(k32{}, k64{});
  else if (N <= 32)
    fn(k64{}, k32{});
  else
    fn(k64{}, k64{});
}

// The persistent grid: one block per tile, at most as many as are resident at once.
template <class Kernel>
int persistent_grid(Kernel kernel, size_t shared_bytes, int tiles) {
  FUSEKIT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
  return std::max(1, std::min(tiles, resident_blocks(kernel, kThreads, shared_bytes)));
}

void check_skinny(const LinearShape& shape) {
  // Tile counts are ceil_div(rows, 256) in int: rows within a tile of INT_MAX would overflow it.
  if (shape.rows > std::numeric_limits<int>::max() - kForwardTileRows16) {
    throw std::invalid_argument("linear: the skinny kernels take at most " +
                                std::to_string(std::numeric_limits<int>::max() - kForwardTileRows16) + " rows (got " +
                                std::to_string(shape.rows) + ")");
  }
  if (shape.padded || shape.out_features > kSkinnyMaxFeatures || shape.in_features > kSkinnyMaxFeatures) {
    throw std::invalid_argument("linear: the skinny kernels take unpadded shapes with features <= 64 (got " +
                                std::to_string(shape.rows) + "x" + std::to_string(shape.out_features) + "x" +
                                std::to_string(shape.in_features) + ")");
  }
}

template <class T>
void forward_typed(const LinearShape& s, const void* x, const void* weight, const void* bias, void* y,
                   cudaStream_t stream) {
  const int M = s.rows, N = s.out_features, K = s.in_features;
  const bool vector_x = aligned16(x), vector_y = aligned16(y);
  if constexpr (std::is_same_v<T, float>) {
    const int R = kTileRows32, NG = ceil_div(N, 4);
    const size_t bytes = (static_cast<size_t>(K) * NG + NG) * 16 +
                         (2 * stage_elements<float>(R * K) + stage_elements<float>(R * N)) * sizeof(float);
    const int grid = persistent_grid(skinny_forward_fma_kernel, bytes, ceil_div(M, R));
    skinny_forward_fma_kernel<<<grid, kThreads, bytes, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(weight), static_cast<const float*>(bias),
        static_cast<float*>(y), M, N, K, R, vector_x, vector_y);
  } else {
    dispatch_padded_sizes(K, N, [&](auto kp, auto np) {
      constexpr int KP = decltype(kp)::value, NP = decltype(np)::value;
      const int R = kForwardTileRows16;
      const size_t bytes = static_cast<size_t>(KP / 16) * (NP / 8) * kWarpSize * sizeof(uint2) +
                           (2 * stage_elements<T>(R * K) + stage_elements<T>(R * N)) * sizeof(T);
      auto kernel = skinny_forward_mma_kernel<T, KP, NP>;
      const int grid = persistent_grid(kernel, bytes, ceil_div(M, R));
      kernel<<<grid, kThreads, bytes, stream>>>(static_cast<const T*>(x), static_cast<const T*>(weight),
                                                static_cast<const T*>(bias), static_cast<T*>(y), M, N, K, R, vector_x,
                                                vector_y);
    });
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(LinearContext& context, const LinearShape& s, const void* dy, const void* x, const void* weight,
                    void* dx, void* dweight, void* dbias, cudaStream_t stream) {
  const int M = s.rows, N = s.out_features, K = s.in_features;
  const bool vector_dy = aligned16(dy), vector_x = aligned16(x), vector_dx = aligned16(dx);
  // The partials: [blocks][N * K] for dW, then [blocks][N] for db.
  auto partials = [&](int blocks) {
    return static_cast<float*>(
        context.scratch(2, static_cast<size_t>(blocks) * (static_cast<size_t>(N) * K + N) * sizeof(float)));
  };
  int grid = 0;
  float* partial = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    const int R = kTileRows32, KG = ceil_div(K, 4);
    const size_t bytes =
        static_cast<size_t>(N) * KG * 16 +
        (2 * stage_elements<float>(R * N) + 2 * stage_elements<float>(R * K) + stage_elements<float>(R * K)) *
            sizeof(float);
    grid = persistent_grid(skinny_backward_fma_kernel, bytes, ceil_div(M, R));
    partial = partials(grid);
    skinny_backward_fma_kernel<<<grid, kThreads, bytes, stream>>>(
        static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(weight),
        static_cast<float*>(dx), partial, dbias ? partial + static_cast<size_t>(grid) * N * K : nullptr, M, N, K, R,
        vector_dy, vector_x, vector_dx);
  } else {
    dispatch_padded_sizes(K, N, [&](auto kp, auto np) {
      constexpr int KP = decltype(kp)::value, NP = decltype(np)::value;
      const int R = kBackwardTileRows16;
      const size_t bytes = static_cast<size_t>(NP / 16) * (KP / 8) * kWarpSize * sizeof(uint2) +
                           (2 * stage_elements<T>(R * N) + 3 * stage_elements<T>(R * K)) * sizeof(T);
      auto kernel = skinny_backward_mma_kernel<T, KP, NP>;
      grid = persistent_grid(kernel, bytes, ceil_div(M, R));
      partial = partials(grid);
      kernel<<<grid, kThreads, bytes, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                static_cast<const T*>(weight), static_cast<T*>(dx), partial,
                                                dbias ? partial + static_cast<size_t>(grid) * N * K : nullptr, M, N, K,
                                                R, vector_dy, vector_x, vector_dx);
    });
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  using layernorm_rows::launch_parameter_gradients;
  using layernorm_rows::ParameterGradients;
  launch_parameter_gradients<T, 1>(partial, grid, N * K, ParameterGradients<T, 1>{{static_cast<T*>(dweight)}}, stream);
  if (dbias) {
    launch_parameter_gradients<T, 1>(partial + static_cast<size_t>(grid) * N * K, grid, N,
                                     ParameterGradients<T, 1>{{static_cast<T*>(dbias)}}, stream);
  }
}

}  // namespace

void skinny_linear_forward(DType dtype, const LinearShape& shape, const void* x, const void* weight, const void* bias,
                           void* y, cudaStream_t stream) {
  check_skinny(shape);
  dispatch_dtype(dtype, "linear", [&](auto type) {
    using T = typename decltype(type)::type;
    forward_typed<T>(shape, x, weight, bias, y, stream);
  });
}

void skinny_linear_backward(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                            const void* x, const void* weight, void* dx, void* dweight, void* dbias,
                            cudaStream_t stream) {
  check_skinny(shape);
  dispatch_dtype(dtype, "linear", [&](auto type) {
    using T = typename decltype(type)::type;
    backward_typed<T>(context, shape, dy, x, weight, dx, dweight, dbias, stream);
  });
}

}  // namespace fusekit::kernels
