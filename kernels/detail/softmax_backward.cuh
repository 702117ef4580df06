// Scale, mask and softmax backward: the register row kernel, the kernel that stages y and dy through
// shared-memory tiles for rows no multiple of a 16-byte vector, and the looping kernel.
#pragma once

#include "kernels/detail/softmax_common.cuh"

namespace fusekit::kernels {
// Included by softmax.cu alone: its kernels keep the anonymous namespace (and so their names in
// traces) of the one translation unit that launches them.
namespace {

// Rows of shared-memory tiles, staged by the backward below: at most kStageVectors 16-byte vectors
// a thread per operand (12 KiB for a block of kLaneKernelThreads).
constexpr int kStageVectors = 3;
constexpr int kStageBytes = kStageVectors * kLaneKernelThreads * 16;

// Copies `elements` consecutive elements of each of N operands from global memory (16-byte aligned)
// into shared-memory tiles: 16-byte vectors (streaming loads, read once), every one of a thread's
// loads issued before its first store; a last partial vector element by element.
template <class T, int N>
__device__ __forceinline__ void load_tiles(const T* const (&from)[N], T* const (&to)[N], int elements) {
  constexpr int kElements = 16 / sizeof(T);
  const int vectors = elements / kElements;
  int4 held[N][kStageVectors];
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int k = 0; k < kStageVectors; ++k) {
      const int i = threadIdx.x + k * kLaneKernelThreads;
      if (i < vectors) held[n][k] = __ldcs(reinterpret_cast<const int4*>(from[n]) + i);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int k = 0; k < kStageVectors; ++k) {
      const int i = threadIdx.x + k * kLaneKernelThreads;
      if (i < vectors) reinterpret_cast<int4*>(to[n])[i] = held[n][k];
    }
    for (int i = vectors * kElements + threadIdx.x; i < elements; i += kLaneKernelThreads) to[n][i] = from[n][i];
  }
}

// The way back: `elements` of a shared-memory tile to global memory (16-byte aligned).
template <class T>
__device__ __forceinline__ void store_tile(const T* tile, T* __restrict__ to, int elements) {
  constexpr int kElements = 16 / sizeof(T);
  const int vectors = elements / kElements;
#pragma unroll
  for (int k = 0; k < kStageVectors; ++k) {
    const int i = threadIdx.x + k * kLaneKernelThreads;
    if (i < vectors) reinterpret_cast<int4*>(to)[i] = reinterpret_cast<const int4*>(tile)[i];
  }
  for (int i = vectors * kElements + threadIdx.x; i < elements; i += kLaneKernelThreads) to[i] = tile[i];
}

// One row group's backward of one row, from y and dy to dx, in global memory (16-byte vectors) or
// in shared memory (VEC 1). Every thread of the row group must call it, its reduction needs them all;
// a thread of a row past the last (!valid) reads and writes nothing. A thread writes only the
// elements it read, so dxr may be yr or dyr.
template <class T, int VEC, int NV, int TPR>
__device__ __forceinline__ void softmax_backward_row(const T* yr, const T* dyr, T* dxr, bool valid, int keys,
                                                     float scale, const RowGroups<TPR>& rg, float* scratch) {
  using V = Vec<T, VEC>;
  const int t = rg.thread;
  // The row stays in registers in its storage type (half the registers of floats for 16-bit types).
  V yv[NV], dyv[NV];
  float dot = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + t) * VEC;
    if (valid && c < keys) {
      yv[j] = V::load_stream(yr + c);
      dyv[j] = V::load_stream(dyr + c);
#pragma unroll
      for (int k = 0; k < VEC; ++k) dot += to_float(yv[j].v[k]) * to_float(dyv[j].v[k]);
    }
  }
  dot = rg.sum(dot, scratch);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + t) * VEC;
    if (valid && c < keys) {
      V out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        out.v[k] = from_float<T>(scale * to_float(yv[j].v[k]) * (to_float(dyv[j].v[k]) - dot));
      }
      out.store(dxr + c);
    }
  }
}

template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? kLaneKernelThreads : TPR)
    softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, float scale,
                            int rows, int keys) {
  wait_for_prior_grid();  // y comes from the forward: launch_after_prior
  __shared__ float scratch[kWarpSize];
  const RowGroups<TPR> rg;
  for (int first = blockIdx.x * rg.count; first < rows; first += gridDim.x * rg.count) {
    const int row = first + rg.index;
    const bool valid = row < rows;  // as in the forward: the whole warp runs every iteration
    const size_t offset = static_cast<size_t>(row) * keys;
    softmax_backward_row<T, VEC, NV, TPR>(y + offset, dy + offset, dx + offset, valid, keys, scale, rg, scratch);
  }
}

// The backward of rows of up to 256 keys that are no multiple of a 16-byte vector (see the top of
// softmax.cu): y and dy staged in two tiles, dx written over y's.
template <class T, int NV, int TPR>
__global__ void __launch_bounds__(kLaneKernelThreads)
    softmax_backward_staged_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, float scale,
                                   int rows, int keys, int tile_rows) {
  static_assert(TPR <= kWarpSize, "staged rows are lanes of a warp");
  wait_for_prior_grid();  // y comes from the forward: launch_after_prior
  extern __shared__ int4 stage[];
  __shared__ float scratch[kWarpSize];
  T* y_tile = reinterpret_cast<T*>(stage);
  T* dy_tile = y_tile + tile_rows * keys;  // a multiple of 16 bytes on
  const RowGroups<TPR> rg;
  for (int first = blockIdx.x * tile_rows; first < rows; first += gridDim.x * tile_rows) {
    const int count = min(tile_rows, rows - first);
    const size_t begin = static_cast<size_t>(first) * keys;
    const T* from[2] = {y + begin, dy + begin};
    T* const to[2] = {y_tile, dy_tile};
    load_tiles<T, 2>(from, to, count * keys);
    __syncthreads();
    for (int r0 = 0; r0 < count; r0 += rg.count) {
      const int r = r0 + rg.index;
      const bool valid = r < count;
      const int offset = (valid ? r : 0) * keys;
      softmax_backward_row<T, 1, NV, TPR>(y_tile + offset, dy_tile + offset, y_tile + offset, valid, keys, scale, rg,
                                          scratch);
    }
    __syncthreads();
    store_tile(y_tile, dx + begin, count * keys);
    __syncthreads();  // the next tile's loads overwrite this one
  }
}

// Any row length: a block per row, y and dy read twice.
template <class T>
__global__ void softmax_backward_looping_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                                float scale, int rows, int keys) {
  __shared__ float scratch[kWarpSize];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const size_t offset = static_cast<size_t>(row) * keys;
    float dot = 0.f;
    for (int c = threadIdx.x; c < keys; c += blockDim.x) dot += to_float(y[offset + c]) * to_float(dy[offset + c]);
    dot = block_sum(dot, scratch);
    for (int c = threadIdx.x; c < keys; c += blockDim.x) {
      dx[offset + c] = from_float<T>(scale * to_float(y[offset + c]) * (to_float(dy[offset + c]) - dot));
    }
  }
}

}  // namespace
}  // namespace fusekit::kernels
