// The skinny linear kernels' shared pieces: block and tile sizes, the asynchronous copies of row
// ranges into shared memory and back, the walk of a block over its row tiles, and the products of
// shared-memory rows with mma.sync fragments or float4 columns.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/detail/mma_fragments.cuh"

namespace fusekit::kernels {
// Included by skinny_linear.cu alone: its kernels keep the anonymous namespace (and so their names
// in traces) of the one translation unit that launches them.
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
// Rows per tile: R * sizeof(T) a multiple of 16, so that every tile's byte range starts 16-byte aligned.
constexpr int kForwardTileRows16 = 256;  // fp16/bf16 forward: 8 warps x 2 m-tiles of 16 rows
constexpr int kBackwardTileRows16 = 128;
constexpr int kTileRows32 = 64;  // fp32

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

}  // namespace
}  // namespace fusekit::kernels
