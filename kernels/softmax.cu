// Scale, mask and softmax forward and backward (see softmax.h for the math and layouts).
//
// Design: the row lives in registers, as in LayerNorm. A row group of TPR threads owns one row at a
// time, each thread holding NV vectors of VEC elements (16 bytes where the key count and pointers
// allow, else single elements): 4..32 lanes of a warp per row for rows up to 1024 elements of 16-bit
// types (odd rows such as Swin's 49 keys take 8 lanes of 8 elements, so a warp works on 4 rows at
// once), a block of 128..1024 threads per row beyond. Rows too long for registers take a looping
// kernel that reads the row twice (correct for any length, slower).
//
// Rows of up to 256 keys that are no multiple of a 16-byte vector (Swin's 49 keys) are read element
// by element in the forward, 8 lanes a row of 49; that kernel is bound by issuing instructions, so
// the row's (b, h, q) comes from multiply-high divisions (fast_divide.h) and Swin's 49 keys get the
// count compiled in. Staging x through shared memory, forming the scores in float in a shared tile,
// and realigning 16-byte vectors with shuffles all add instructions and measured slower. Their
// backward, with no bias to read, stages y and dy in shared-memory tiles, so that global memory sees
// only 16-byte vectors.
//
// The masks become, per row, a key limit (padding, causal: keys at or past it are removed) and
// pointers to the row's additive terms (bias). Removed keys are not read at all, so a padded or
// causal forward reads only the scores it keeps. The lane kernels compile the mask kind in, form the
// scores in base 2 (z * log2(e)), and take each exponential as one subtraction and one
// ex2.approx.ftz, which halves the kernel's instructions where it is bound by issuing them.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/fast_divide.h"
#include "kernels/softmax.h"

namespace fusekit::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---- CUDA kernels

// One row's mask: keys at or past `limit` are removed; `bias` and `window` point at the row's
// additive terms, or are null.
template <class T>
struct RowMask {
  int limit;
  const T* bias;
  const T* window;
};

// The mask of every row, resolved per row from its (b, h, q): row = (b * heads + h) * queries + q.
template <class T>
struct Masking {
  SoftmaxMask kind;
  const int32_t* lengths;
  const T* bias;
  const T* window_mask;
  FastDivide windows;
  FastDivide heads;
  FastDivide queries;
  int keys;

  // The mask of `row` for a mask kind known at compile time (the lane kernels), or read from `kind`.
  template <SoftmaxMask KIND>
  __device__ RowMask<T> row_of(int row) const {
    const int bh = queries.quotient(row);
    const int q = row - bh * queries.divisor;
    RowMask<T> m{keys, nullptr, nullptr};
    if constexpr (KIND == SoftmaxMask::padding) {
      m.limit = min(max(lengths[heads.quotient(bh)], 0), keys);
    } else if constexpr (KIND == SoftmaxMask::causal) {
      m.limit = min(max(q + 1 + keys - queries.divisor, 0), keys);
    } else if constexpr (KIND == SoftmaxMask::bias) {
      const int b = heads.quotient(bh);
      const int h = bh - b * heads.divisor;
      m.bias = bias + (static_cast<size_t>(h) * queries.divisor + q) * keys;
      if (window_mask) {
        const int w = b - windows.quotient(b) * windows.divisor;
        m.window = window_mask + (static_cast<size_t>(w) * queries.divisor + q) * keys;
      }
    }
    return m;
  }
  __device__ RowMask<T> row(int row) const {
    switch (kind) {
      case SoftmaxMask::padding:
        return row_of<SoftmaxMask::padding>(row);
      case SoftmaxMask::causal:
        return row_of<SoftmaxMask::causal>(row);
      case SoftmaxMask::bias:
        return row_of<SoftmaxMask::bias>(row);
      default:
        return row_of<SoftmaxMask::none>(row);
    }
  }
};

// 2^x by the special-function unit alone (denormal results flush to 0: they are below 2^-126 of
// the row's largest term, which is 1), and 1/x likewise for the row sums (at least 1).
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float reciprocal_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The kept score of key c, for the looping kernels.
template <class T>
__device__ __forceinline__ float score(const T* xr, const RowMask<T>& m, int c, float scale) {
  float z = scale * to_float(xr[c]);
  if (m.bias) z += to_float(m.bias[c]);
  if (m.window) z += to_float(m.window[c]);
  return z;
}

constexpr int kLaneKernelThreads = 256;

// KIND: the mask kind, compiled in, so that a row's mask costs only what its kind needs. KEYS > 0:
// the key count compiled in, for the bias mask only (it removes no key, so every row keeps KEYS):
// Swin's window-7 rows of 49 keys, where a known count removes each element's bounds test (see the
// top of the file).
template <class T, int VEC, int NV, int TPR, SoftmaxMask KIND, int KEYS = 0>
__global__ void __launch_bounds__(TPR <= kWarpSize ? kLaneKernelThreads : TPR)
    softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, Masking<T> masking, float scale, int rows) {
  static_assert(KEYS == 0 || KIND == SoftmaxMask::bias, "a compiled-in key count needs the bias mask");
  // Only padding and causal masks cut a row inside a vector: the vector width divides the key count.
  constexpr bool kCutsVectors = (KIND == SoftmaxMask::padding || KIND == SoftmaxMask::causal) && VEC > 1;
  __shared__ float scratch[kWarpSize];
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  const int keys = KEYS > 0 ? KEYS : masking.keys;
  // The scores are kept in base 2, z * log2(e), so each exponential is one subtraction and one
  // special-function instruction.
  const float scale2 = scale * kLog2e;

  // Every lane of a warp runs every iteration (its shuffles need the whole warp); a row group past
  // the last row keeps no key and writes nothing (with KEYS, it reads the last row and writes nothing).
  for (int first = blockIdx.x * groups; first < rows; first += gridDim.x * groups) {
    const bool valid = first + group < rows;
    const int row = KEYS > 0 && !valid ? rows - 1 : first + group;
    const RowMask<T> m = KEYS > 0 || valid ? masking.template row_of<KIND>(row) : RowMask<T>{0, nullptr, nullptr};
    const int limit = KEYS > 0 ? KEYS : m.limit;
    const T* xr = x + static_cast<size_t>(row) * keys;
    float v[NV][VEC];
    float high = -INFINITY;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (c < limit) {
        const V in = V::load_stream(xr + c);
        V bias, window;
        if constexpr (KIND == SoftmaxMask::bias) {
          bias = V::load(m.bias + c);
          if (m.window) window = V::load(m.window + c);
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          float z;
          if constexpr (KIND == SoftmaxMask::bias) {
            z = fmaf(scale, to_float(in.v[k]), to_float(bias.v[k]));
            if (m.window) z += to_float(window.v[k]);
            z *= kLog2e;
          } else {
            z = scale2 * to_float(in.v[k]);
          }
          if constexpr (kCutsVectors) z = k < limit - c ? z : -INFINITY;
          v[j][k] = z;
          high = fmaxf(high, z);
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[j][k] = -INFINITY;
      }
    }
    // A row with no key left has max -inf: shift by 0 instead, so every exponential is 2^-inf = 0
    // and the row writes zeros rather than NaN.
    high = rg.max(high, scratch);
    const float shift = high == -INFINITY ? 0.f : high;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        v[j][k] = exp2_ftz(v[j][k] - shift);
        sum += v[j][k];
      }
    }
    sum = rg.sum(sum, scratch);
    const float inverse = sum > 0.f ? reciprocal_ftz(sum) : 0.f;
    T* yr = y + static_cast<size_t>(row) * keys;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < keys) {
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[j][k] * inverse);
        out.store(yr + c);
      }
    }
  }
}

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

// Any row length: a block per row. The first pass keeps a running maximum and the sum of
// exponentials relative to it per thread (rescaled when the maximum grows); the block then
// combines the threads' pairs, and the second pass re-reads the row to write y.
template <class T>
__global__ void softmax_forward_looping_kernel(const T* __restrict__ x, T* __restrict__ y, Masking<T> masking,
                                               float scale, int rows) {
  __shared__ float scratch[kWarpSize];
  const int keys = masking.keys;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const RowMask<T> m = masking.row(row);
    const T* xr = x + static_cast<size_t>(row) * keys;
    float high = -INFINITY, sum = 0.f;
    for (int c = threadIdx.x; c < m.limit; c += blockDim.x) {
      const float z = score(xr, m, c, scale);
      if (z > high) {
        sum = sum * exp2f((high - z) * kLog2e) + 1.f;  // exp(-inf) = 0 clears the empty start
        high = z;
      } else if (high != -INFINITY) {
        sum += exp2f((z - high) * kLog2e);
      }
    }
    const float row_high = block_max(high, scratch);
    const float shift = row_high == -INFINITY ? 0.f : row_high;
    const float row_sum = block_sum(high == -INFINITY ? 0.f : sum * exp2f((high - shift) * kLog2e), scratch);
    const float inverse = row_sum > 0.f ? 1.f / row_sum : 0.f;
    T* yr = y + static_cast<size_t>(row) * keys;
    for (int c = threadIdx.x; c < keys; c += blockDim.x) {
      const float p = c < m.limit ? exp2f((score(xr, m, c, scale) - shift) * kLog2e) * inverse : 0.f;
      yr[c] = from_float<T>(p);
    }
  }
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

// The backward of rows of up to 256 keys that are no multiple of a 16-byte vector (see the top of the
// file): y and dy staged in two tiles, dx written over y's.
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

// ---- kernel launchers

// A register configuration: TPR threads per row, NV vectors per thread.
struct Config {
  int tpr;
  int nv;
};

// The configuration that holds a row of `vectors` vectors of `vec` elements with few idle lanes:
// one 16-byte vector a lane where that fills 4..32 lanes exactly, else 4..32 lanes per row with up
// to 4 vectors each (8 single elements each where vec is 1), else a block per row with 4 vectors
// per thread, or 8 where max_block_nv allows; {0, 0} if none does. One vector a lane holds fewer
// registers, so more rows are in flight. Rows that a padding or causal mask cuts short (`cut_rows`,
// forward) are read in part, so there a row of exactly 2 x 16 or 2 x 32 vectors takes two vectors a
// lane on half the lanes: each shuffle of the reductions then serves twice the elements (measured
// faster at 256 and 512 keys; not at 128, nor for rows read whole).
Config choose_config(int vectors, int vec, int max_block_nv, bool cut_rows = false) {
  if (cut_rows && vec > 1) {
    for (int tpr : {16, 32}) {
      if (vectors == 2 * tpr) return {tpr, 2};
    }
  }
  for (int tpr : {4, 8, 16, 32}) {
    if (vec > 1 && vectors == tpr) return {tpr, 1};
  }
  const int lane_nv = vec == 1 ? 8 : 4;
  for (int tpr : {4, 8, 16, 32}) {
    if (vectors <= tpr * lane_nv) {
      const int nv = ceil_div(vectors, tpr);
      return {tpr, nv > 4 ? 8 : nv};
    }
  }
  for (int tpr : {128, 256, 512, 1024}) {
    if (vectors <= tpr * 4) return {tpr, 4};
  }
  if (max_block_nv >= 8 && vectors <= 1024 * 8) return {1024, 8};
  return {0, 0};
}

// Maps the configuration to the kernel template; FN is called with the compile-time TPR and NV.
template <class FN>
bool dispatch_config(Config config, FN&& fn) {
#define FUSEKIT_SOFTMAX_CASE(TPR_, NV_)                                          \
  if (config.tpr == TPR_ && config.nv == NV_) {                                  \
    fn(std::integral_constant<int, TPR_>{}, std::integral_constant<int, NV_>{}); \
    return true;                                                                 \
  }
#define FUSEKIT_SOFTMAX_LANES(TPR_) \
  FUSEKIT_SOFTMAX_CASE(TPR_, 1)     \
  FUSEKIT_SOFTMAX_CASE(TPR_, 2)     \
  FUSEKIT_SOFTMAX_CASE(TPR_, 3) FUSEKIT_SOFTMAX_CASE(TPR_, 4) FUSEKIT_SOFTMAX_CASE(TPR_, 8)
  FUSEKIT_SOFTMAX_LANES(4)
  FUSEKIT_SOFTMAX_LANES(8)
  FUSEKIT_SOFTMAX_LANES(16)
  FUSEKIT_SOFTMAX_LANES(32)
  FUSEKIT_SOFTMAX_CASE(128, 4)
  FUSEKIT_SOFTMAX_CASE(256, 4)
  FUSEKIT_SOFTMAX_CASE(512, 4)
  FUSEKIT_SOFTMAX_CASE(1024, 4)
  FUSEKIT_SOFTMAX_CASE(1024, 8)
#undef FUSEKIT_SOFTMAX_LANES
#undef FUSEKIT_SOFTMAX_CASE
  return false;
}

// Whether a configuration exists as a kernel: 8 vectors per thread only where the registers hold
// them (the forward keeps NV * VEC floats, the backward 2 * NV vectors of the storage type), and
// for lanes per row only with single elements, as choose_config picks it.
template <int VEC, int NV, int TPR>
constexpr bool instantiated(bool backward) {
  if constexpr (NV != 8) return true;
  if (TPR <= kWarpSize) return VEC == 1;
  return backward ? VEC == 1 : VEC * NV <= 32;
}

// Grid size: enough row groups for every row, at most 64 blocks per multiprocessor (the kernels
// loop over rows).
int grid_blocks(int rows, int rows_per_block) {
  return std::max(1, std::min(ceil_div(rows, rows_per_block), 64 * multiprocessors()));
}

// Rows of a staged tile for row groups of `tpr` lanes: whole passes of the block's row groups, as
// many as fit in kStageBytes (at least one: a pass holds at most 256 x 8 elements of <= 4 bytes).
int staged_tile_rows(int tpr, int keys, size_t element_bytes) {
  const int rows_per_pass = kLaneKernelThreads / tpr;
  const size_t pass_bytes = static_cast<size_t>(rows_per_pass) * keys * element_bytes;
  return rows_per_pass * std::max<int>(1, static_cast<int>(kStageBytes / pass_bytes));
}

template <class T>
void forward_typed(const T* x, T* y, const Masking<T>& masking, float scale, int rows, cudaStream_t stream) {
  const int keys = masking.keys;
  const int vec = vector_width<T>(keys, {x, y, masking.bias, masking.window_mask});
  const int max_block_nv = 32 / vec >= 8 ? 8 : 4;
  const bool cut_rows = masking.kind == SoftmaxMask::padding || masking.kind == SoftmaxMask::causal;
  const Config config = choose_config(keys / vec, vec, max_block_nv, cut_rows);
  if (vec == 1 && keys == 49 && masking.kind == SoftmaxMask::bias) {
    // Swin's window 7: 8 lanes a row, 7 elements each, the key count compiled in.
    softmax_forward_kernel<T, 1, 7, 8, SoftmaxMask::bias, 49>
        <<<grid_blocks(rows, kLaneKernelThreads / 8), kLaneKernelThreads, 0, stream>>>(x, y, masking, scale, rows);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto launch = [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (instantiated<VEC, NV, TPR>(false)) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const dim3 grid(grid_blocks(rows, threads / TPR));
        switch (masking.kind) {
          case SoftmaxMask::padding:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::padding>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
            break;
          case SoftmaxMask::causal:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::causal>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
            break;
          case SoftmaxMask::bias:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::bias>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
            break;
          default:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::none>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
        }
      } else {
        throw std::logic_error("softmax: no forward kernel for the chosen configuration");
      }
    });
    if (!done) {
      softmax_forward_looping_kernel<T><<<grid_blocks(rows, 1), 1024, 0, stream>>>(x, y, masking, scale, rows);
    }
  };
  if (vec == 1)
    launch(std::integral_constant<int, 1>{});
  else
    launch(std::integral_constant<int, 16 / sizeof(T)>{});
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(const T* y, const T* dy, T* dx, float scale, int rows, int keys, cudaStream_t stream) {
  const int vec = vector_width<T>(keys, {y, dy, dx});
  const Config config = choose_config(keys / vec, vec, vec == 1 ? 8 : 4);
  if (vec == 1 && config.tpr > 0 && config.tpr <= kWarpSize && aligned16(y) && aligned16(dy) && aligned16(dx)) {
    const int tile_rows = staged_tile_rows(config.tpr, keys, sizeof(T));
    const size_t shared = 2 * static_cast<size_t>(tile_rows) * keys * sizeof(T);
    dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (TPR <= kWarpSize) {
        launch_after_prior(softmax_backward_staged_kernel<T, NV, TPR>, dim3(grid_blocks(rows, tile_rows)),
                           dim3(kLaneKernelThreads), shared, stream, y, dy, dx, scale, rows, keys, tile_rows);
      }
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto launch = [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (instantiated<VEC, NV, TPR>(true)) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        launch_after_prior(softmax_backward_kernel<T, VEC, NV, TPR>, dim3(grid_blocks(rows, threads / TPR)),
                           dim3(threads), 0, stream, y, dy, dx, scale, rows, keys);
      } else {
        throw std::logic_error("softmax: no backward kernel for the chosen configuration");
      }
    });
    if (!done) {
      softmax_backward_looping_kernel<T><<<grid_blocks(rows, 1), 1024, 0, stream>>>(y, dy, dx, scale, rows, keys);
    }
  };
  if (vec == 1)
    launch(std::integral_constant<int, 1>{});
  else
    launch(std::integral_constant<int, 16 / sizeof(T)>{});
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

// Rows of the problem; throws std::invalid_argument for sizes it cannot take.
int checked_rows(SoftmaxShape s) {
  if (s.batch < 0 || s.heads <= 0 || s.queries <= 0 || s.keys <= 0) {
    throw std::invalid_argument("softmax: batch must be >= 0 and heads, queries, keys > 0 (got " +
                                std::to_string(s.batch) + "x" + std::to_string(s.heads) + "x" +
                                std::to_string(s.queries) + "x" + std::to_string(s.keys) + ")");
  }
  const long long rows = static_cast<long long>(s.batch) * s.heads * s.queries;
  if (rows > INT_MAX) {
    throw std::invalid_argument("softmax: batch x heads x queries must be at most " + std::to_string(INT_MAX) +
                                " rows (got " + std::to_string(rows) + ")");
  }
  return static_cast<int>(rows);
}

void check_masking(const SoftmaxMasking& m) {
  if (m.kind == SoftmaxMask::padding && !m.lengths) {
    throw std::invalid_argument("softmax: the padding mask needs lengths");
  }
  if (m.kind == SoftmaxMask::bias && !m.bias) throw std::invalid_argument("softmax: the bias mask needs a bias");
  if (m.kind == SoftmaxMask::bias && m.window_mask && m.windows <= 0) {
    throw std::invalid_argument("softmax: a window mask needs windows >= 1 (got " + std::to_string(m.windows) + ")");
  }
}

}  // namespace

void softmax_forward(DType dtype, const void* x, void* y, SoftmaxShape shape, float scale,
                     const SoftmaxMasking& masking, cudaStream_t stream) {
  const int rows = checked_rows(shape);
  check_masking(masking);
  if (rows == 0) return;
  dispatch_dtype(dtype, "softmax", [&](auto type) {
    using T = typename decltype(type)::type;
    const bool bias = masking.kind == SoftmaxMask::bias;
    const Masking<T> m{masking.kind,
                       masking.lengths,
                       bias ? static_cast<const T*>(masking.bias) : nullptr,
                       bias ? static_cast<const T*>(masking.window_mask) : nullptr,
                       FastDivide(std::max(masking.windows, 1)),
                       FastDivide(shape.heads),
                       FastDivide(shape.queries),
                       shape.keys};
    forward_typed<T>(static_cast<const T*>(x), static_cast<T*>(y), m, scale, rows, stream);
  });
}

void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, SoftmaxShape shape, float scale,
                      cudaStream_t stream) {
  const int rows = checked_rows(shape);
  if (rows == 0) return;
  dispatch_dtype(dtype, "softmax", [&](auto type) {
    using T = typename decltype(type)::type;
    backward_typed<T>(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), scale, rows, shape.keys,
                      stream);
  });
}

}  // namespace fusekit::kernels
