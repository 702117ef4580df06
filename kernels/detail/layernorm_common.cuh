// The pieces that every row-normalizing kernel of fusekit shares (LayerNorm, bias + dropout +
// residual + LayerNorm, embedding + LayerNorm, the gathered LayerNorm of Swin's window partition and
// patch merging; the skinny linear backward uses the parameter-gradient reduction): how a block
// splits into row groups, which register configuration holds a row, the vector width the pointers
// allow, and the second stage of the parameter-gradient reduction.
//
// A row group of TPR threads owns one row at a time, each thread holding NV vectors of VEC elements:
// TPR = 4..32 lanes of a warp per row (several rows per block), TPR = 128..1024 a block per row.
// Thread t of a group holds the columns (j * TPR + t) * VEC .. + VEC - 1 for j < NV.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/common.cuh"

namespace fusekit::kernels::layernorm_rows {

// Lanes-per-row kernels run 256 threads a block (up to 255 registers for the backward's accumulators;
// 512-thread blocks, with half the partial rows, measured slower at BERT shapes).
constexpr int kLaneKernelThreads = 256;

// A register configuration: TPR threads per row, NV vectors per thread.
struct Config {
  int tpr;
  int nv;
};

// The configuration that holds a row of `vectors` vectors with the fewest idle lanes: 4..32 lanes
// per row with up to 4 vectors each, else a block per row; {0, 0} if none does.
inline Config choose_config(int vectors, int max_nv) {
  for (int tpr : {4, 8, 16, 32}) {
    if (vectors <= tpr * 4) return {tpr, ceil_div(vectors, tpr)};
  }
  for (int tpr : {128, 256, 512, 1024}) {
    if (vectors <= tpr * 4) return {tpr, 4};
  }
  if (max_nv >= 8 && vectors <= 1024 * 8) return {1024, 8};
  return {0, 0};
}

// The configurations the fused row kernels (bias + dropout + residual + LayerNorm, embedding +
// LayerNorm) instantiate: up to 4 vectors a thread and `max_tpr` threads a row ({0, 0}: their looping
// kernels). With one element per vector (odd row lengths, misaligned pointers: the general path)
// only NV = 4 is built, the rest of the lanes idle.
inline Config choose_row_config(int vectors, int max_tpr, int vec) {
  Config config = choose_config(vectors, 4);
  if (config.tpr > max_tpr) return {0, 0};
  if (vec == 1 && config.tpr > 0 && config.tpr <= kWarpSize) config.nv = 4;
  return config;
}
template <int VEC, int NV>
constexpr bool kRowConfigBuilt = NV <= 4 && (VEC > 1 || NV == 4);

// The backward's configuration: it holds two float accumulators per column besides the row, so
// rows that fit 32 lanes take one vector a lane (more lanes per row, fewer registers, more rows in
// flight); longer rows as choose_config.
inline Config choose_backward_config(int vectors) {
  for (int tpr : {4, 8, 16, 32}) {
    if (vectors <= tpr) return {tpr, 1};
  }
  return choose_config(vectors, 4);
}

// A block per row with one vector a thread, for rows of 33..256 vectors of 16 bytes: 64, 128 or 256
// threads ({0, 0} outside that range). The fused backwards, which keep three or more sums per column
// besides the row, take it where it measured faster (see their launchers): the sums stay in registers
// (VEC floats each), and each column has one owner thread in the block, so sums kept per block need
// no atomics. A 768-column fp16 row leaves the last warp idle; 96-thread blocks measured no faster.
// LayerNorm's own backward measured slower with it and keeps lanes per row.
inline Config block_row_config(int vectors) {
  if (vectors <= kWarpSize) return {0, 0};
  for (int tpr : {64, 128, 256}) {
    if (vectors <= tpr) return {tpr, 1};
  }
  return {0, 0};
}

// Maps a block_row_config to the kernel template, as dispatch_config: FN(TPR, NV = 1).
template <class FN>
bool dispatch_block_row_config(Config config, FN&& fn) {
  if (config.nv != 1) return false;
  switch (config.tpr) {
    case 64:
      fn(std::integral_constant<int, 64>{}, std::integral_constant<int, 1>{});
      return true;
    case 128:
      fn(std::integral_constant<int, 128>{}, std::integral_constant<int, 1>{});
      return true;
    case 256:
      fn(std::integral_constant<int, 256>{}, std::integral_constant<int, 1>{});
      return true;
    default:
      return false;
  }
}

// The most partial rows a backward writes (its workspace is sized for them): enough blocks to fill
// the GPU, at least 8 rows a block beyond that (the partials' traffic stays small next to the
// rows'), at most 16 a multiprocessor. The backward launches one wave: as many of them as are
// resident at once, since each block writes its partial row once, after all its rows.
inline int backward_block_limit(int rows) {
  const int sms = multiprocessors();
  return std::max(1, std::min(rows, std::max(sms, std::min(rows / 8, 16 * sms))));
}

// Maps the configuration to the kernel template; FN is called with the compile-time TPR and NV.
// Every configuration is instantiated: FN skips those it has none for with `if constexpr`.
template <class FN>
bool dispatch_config(Config config, FN&& fn) {
#define FUSEKIT_LN_CASE(TPR_, NV_)                                               \
  if (config.tpr == TPR_ && config.nv == NV_) {                                  \
    fn(std::integral_constant<int, TPR_>{}, std::integral_constant<int, NV_>{}); \
    return true;                                                                 \
  }
#define FUSEKIT_LN_LANES(TPR_) \
  FUSEKIT_LN_CASE(TPR_, 1) FUSEKIT_LN_CASE(TPR_, 2) FUSEKIT_LN_CASE(TPR_, 3) FUSEKIT_LN_CASE(TPR_, 4)
  FUSEKIT_LN_LANES(4)
  FUSEKIT_LN_LANES(8)
  FUSEKIT_LN_LANES(16)
  FUSEKIT_LN_LANES(32)
  FUSEKIT_LN_CASE(128, 4)
  FUSEKIT_LN_CASE(256, 4)
  FUSEKIT_LN_CASE(512, 4)
  FUSEKIT_LN_CASE(1024, 4)
  FUSEKIT_LN_CASE(1024, 8)
#undef FUSEKIT_LN_LANES
#undef FUSEKIT_LN_CASE
  return false;
}

// Calls FN with the compile-time vector width: 1, or 16 bytes of T.
template <class T, class FN>
void dispatch_vector_width(int vec, FN&& fn) {
  if (vec == 1)
    fn(std::integral_constant<int, 1>{});
  else
    fn(std::integral_constant<int, 16 / sizeof(T)>{});
}

// Loads thread t's vectors of a row: out[j] = load(c) for column c = (j * TPR + t) * VEC, j < NV,
// where `valid` and c < C; other entries are left as they are. Every load is issued before any is
// used: with a use inside each load's branch, each load waited for the one before. The callers'
// later passes test the same condition before reading an entry.
template <int TPR, int VEC, class V, int NV, class Load>
__device__ __forceinline__ void load_vectors(V (&out)[NV], bool valid, int C, int t, Load&& load) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c = (j * TPR + t) * VEC;
    if (valid && c < C) out[j] = load(c);
  }
}

// A vector that load_vectors already loaded (LOADED) or a streaming load of it now: the row
// kernels that load first only in some configurations read their operands through this.
template <bool LOADED, class V, class T>
__device__ __forceinline__ V loaded_or_load(const V& loaded, const T* p) {
  if constexpr (LOADED)
    return loaded;
  else
    return V::load_stream(p);
}

// The end of a backward kernel's first reduction stage: each thread holds K parameter-gradient
// accumulators for its columns (acc[k][j][v] for column (j * TPR + t) * VEC + v), summed over the
// rows it visited; the block writes their sum over its row groups as K partial rows of C floats,
// block_partial[k * C + c]. A block per row: every column has one owner thread, which writes it.
// Lanes per row: the row groups of a warp hold the same columns, so they meet with shuffles, then
// the block's warps in `warp_partial` (dynamic shared memory of K * C floats per warp).
template <int K, int NV, int VEC, int TPR>
__device__ void write_block_partials(float (&acc)[K][NV][VEC], float* __restrict__ block_partial,
                                     float* __restrict__ warp_partial, int C, int t) {
  if constexpr (!RowGroups<TPR>::kLanesPerRow) {
    // 16-byte stores where the partial rows allow them: a warp's scalar stores of 8 consecutive floats a
    // thread touched 32 sectors for 4 sectors' worth of data, and every block writes at once at the end
    // of a one-wave grid.
    const bool wide = VEC % 4 == 0 && C % 4 == 0 && reinterpret_cast<uintptr_t>(block_partial) % 16 == 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (c < C) {
#pragma unroll
        for (int q = 0; q < K; ++q) {
          if (wide) {
#pragma unroll
            for (int v = 0; v + 3 < VEC; v += 4) {
              *reinterpret_cast<float4*>(block_partial + q * C + c + v) =
                  make_float4(acc[q][j][v], acc[q][j][v + 1], acc[q][j][v + 2], acc[q][j][v + 3]);
            }
          } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) block_partial[q * C + c + v] = acc[q][j][v];
          }
        }
      }
    }
  } else {
    const int warp = threadIdx.x / kWarpSize, warps = blockDim.x / kWarpSize;
#pragma unroll
    for (int q = 0; q < K; ++q) {
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
#pragma unroll
          for (int offset = TPR; offset < kWarpSize; offset *= 2)
            acc[q][j][v] += __shfl_xor_sync(0xffffffffu, acc[q][j][v], offset);
        }
      }
    }
    if (threadIdx.x % kWarpSize < TPR) {
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        if (c < C) {
#pragma unroll
          for (int q = 0; q < K; ++q) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) warp_partial[(warp * K + q) * C + c + v] = acc[q][j][v];
          }
        }
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < K * C; i += blockDim.x) {
      float sum = 0.f;
      for (int w = 0; w < warps; ++w) sum += warp_partial[w * K * C + i];
      block_partial[i] = sum;
    }
  }
}

// Where a backward kernel keeps its K parameter-gradient sums of its columns between rows, and how
// the block's partial rows come out of them (block_partial[k * C + c]).
//   Registers: K x NV x VEC floats a thread, combined by write_block_partials. The default.
//   Shared memory (kShared, a warp per row only: TPR = 32): [warp][K][VEC][C / VEC] floats in the
//   dynamic shared memory the lanes-per-row kernels already have for write_block_partials. Each column
//   has one owner lane in its warp, and consecutive lanes add to consecutive floats (no bank
//   conflicts). It takes K x NV x VEC floats off every thread's registers: at BERT shapes the
//   register sums bound residency.
//   The fused row backwards (bias + dropout + residual + LayerNorm, embedding + LayerNorm) use it;
//   LayerNorm's own backward measured faster with its sums in registers and keeps them there.
template <int K, int NV, int VEC, int TPR, bool kShared>
struct ColumnSums {
  static_assert(!kShared || TPR == kWarpSize, "shared-memory sums need a warp per row");
  float acc[kShared ? 1 : K][kShared ? 1 : NV][kShared ? 1 : VEC];
  float* mine = nullptr;  // kShared: this warp's [K][VEC][C / VEC]
  int vectors = 0;        // C / VEC

  __device__ ColumnSums(float* shared, int C) {
    if constexpr (kShared) {
      vectors = C / VEC;
      mine = shared + static_cast<size_t>(threadIdx.x / kWarpSize) * K * C;
      for (int i = threadIdx.x % kWarpSize; i < K * C; i += kWarpSize) mine[i] = 0.f;
      __syncwarp();
    } else {
#pragma unroll
      for (int q = 0; q < K; ++q) {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[q][j][k] = 0.f;
        }
      }
    }
  }

  // Sum q of element k of the thread's vector j (column (j * TPR + t) * VEC + k) += value.
  __device__ __forceinline__ void add(int q, int j, int k, float value) {
    if constexpr (kShared)
      mine[(q * VEC + k) * vectors + j * kWarpSize + threadIdx.x % kWarpSize] += value;
    else
      acc[q][j][k] += value;
  }

  // The block's K partial rows; every thread of the block calls it, after its last row.
  __device__ void write(float* __restrict__ block_partial, float* __restrict__ shared, int C, int t) {
    if constexpr (kShared) {
      __syncthreads();
      const int warps = blockDim.x / kWarpSize;
      for (int i = threadIdx.x; i < K * C; i += blockDim.x) {
        const int q = i / C, c = i % C;
        const int at = (q * VEC + c % VEC) * vectors + c / VEC;
        float sum = 0.f;
        for (int w = 0; w < warps; ++w) sum += shared[static_cast<size_t>(w) * K * C + at];
        block_partial[i] = sum;
      }
    } else {
      write_block_partials<K, NV, VEC, TPR>(acc, block_partial, shared, C, t);
    }
  }
};

// The outputs of the second reduction stage: K parameter gradients of C columns each.
template <class T, int K>
struct ParameterGradients {
  T* out[K];
};

// out[k][c] = sum_p partial[p][k][c]. A block of kGradientColumns columns x 128 slices of p
// (narrow column tiles, so that rows of 384..1024 columns give 48..128 blocks: with 32-column tiles
// they used 12..32 multiprocessors); a warp's loads cover 4 slices of 8 columns, one 32-byte sector
// each. The slices meet in shared memory, and warp w sums column w of the tile. The first stage
// (the backward kernels) writes one partial row per block.
constexpr int kGradientColumns = 8;
constexpr int kGradientThreads = 1024;

// The work of block `tile` (columns tile * kGradientColumns..) of kGradientThreads threads; other
// kernels that run this second stage beside other work call it from some of their blocks.
template <class T, int K>
__device__ __forceinline__ void parameter_gradient_tile(const float* __restrict__ partial, int parts, int C,
                                                        const ParameterGradients<T, K>& gradients, int tile) {
  constexpr int kSlices = kGradientThreads / kGradientColumns;
  __shared__ float sums[K][kSlices][kGradientColumns + 1];
  const int x = threadIdx.x % kGradientColumns, slice = threadIdx.x / kGradientColumns;
  const int c0 = tile * kGradientColumns, c = c0 + x;
  float s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = 0.f;
  if (c < C) {
    for (int p = slice; p < parts; p += kSlices) {
#pragma unroll
      for (int k = 0; k < K; ++k) s[k] += partial[(static_cast<size_t>(p) * K + k) * C + c];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) sums[k][slice][x] = s[k];
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (warp < kGradientColumns && c0 + warp < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float v = 0.f;
      for (int i = lane; i < kSlices; i += kWarpSize) v += sums[k][i][warp];
      v = warp_sum(v);
      if (lane == 0) gradients.out[k][c0 + warp] = from_float<T>(v);
    }
  }
}

template <class T, int K>
__global__ void __launch_bounds__(kGradientThreads)
    parameter_gradient_kernel(const float* __restrict__ partial, int parts, int C, ParameterGradients<T, K> gradients) {
  wait_for_prior_grid();  // the partial rows come from the kernel before
  parameter_gradient_tile<T, K>(partial, parts, C, gradients, blockIdx.x);
}

template <class T, int K>
void launch_parameter_gradients(const float* partial, int parts, int C, ParameterGradients<T, K> gradients,
                                cudaStream_t stream) {
  launch_after_prior(parameter_gradient_kernel<T, K>, dim3(ceil_div(C, kGradientColumns)), dim3(kGradientThreads), 0,
                     stream, partial, parts, C, gradients);
}

}  // namespace fusekit::kernels::layernorm_rows
