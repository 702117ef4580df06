// Embedding + LayerNorm: the last step of either backward. The three table gradients converted
// from their float sums (sorted: one launch with the dgamma/dbeta sums; unsorted: every row of the
// three tables written once, unused word rows zero).
#pragma once

#include "kernels/detail/embedding_layernorm_common.cuh"

namespace fusekit::kernels {
// Included by embedding_layernorm.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

// The rows of the tables after the sorted backward: slot y (of `slots`) converts rows
// kRowsAtOnce * y + i, i < kRowsAtOnce, then the same rows kRowsAtOnce * slots further on, ..., x of
// `threads` threads on each row; a thread's loads of all its rows are issued before their stores,
// so that two rows' loads are in flight at once. Rows of whole float4s are read as float4s, the
// last use of the sums.
constexpr int kRowsAtOnce = 2;

template <class T, int VEC>
__device__ __forceinline__ void sorted_table_rows(const SortedTokens& s, const float* __restrict__ word_sums,
                                                  const float* __restrict__ small_sums, T* __restrict__ dword,
                                                  T* __restrict__ dposition, T* __restrict__ dtype, int positions,
                                                  int types, int C, int vocab, int x, int threads, int y, int slots) {
  // At most vocab places of the list: after a backward on the same counts the counter holds more.
  const int repeated = min(*s.repeated, vocab), total = repeated + positions + types;
  // Row `row`'s float sums and the gradient row they become.
  auto place = [&](int row, const float*& from, T*& to) {
    if (row < repeated) {
      const int2 pair = s.pairs[row];  // (word, the row of word_sums that sums it)
      from = word_sums + static_cast<size_t>(pair.y) * C;
      to = dword + static_cast<size_t>(pair.x) * C;
    } else {
      const int small = row - repeated;
      from = small_sums + static_cast<size_t>(small) * C;
      to = small < positions ? dposition + static_cast<size_t>(small) * C
                             : dtype + static_cast<size_t>(small - positions) * C;
    }
  };
  constexpr int R = kRowsAtOnce;
  constexpr bool kFloat4Vectors = VEC % 4 == 0;
  const bool float4s = kFloat4Vectors && C % 4 == 0;
  for (int first = R * y; first < total; first += R * slots) {
    const float* from[R];
    T* to[R];
    const int rows = min(R, total - first);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i < rows) place(first + i, from[i], to[i]);
    }
    for (int c = x * VEC; c < C; c += threads * VEC) {
      float v[R][VEC];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i >= rows) continue;
        if constexpr (kFloat4Vectors) {
          if (float4s) {
#pragma unroll
            for (int q = 0; q < VEC / 4; ++q) {
              const float4 f = __ldcs(reinterpret_cast<const float4*>(from[i] + c) + q);
              v[i][4 * q] = f.x;
              v[i][4 * q + 1] = f.y;
              v[i][4 * q + 2] = f.z;
              v[i][4 * q + 3] = f.w;
            }
            continue;
          }
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[i][k] = from[i][c + k];
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i >= rows) continue;
        Vec<T, VEC> out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[i][k]);
        out.store(to[i] + c);
      }
    }
  }
}

// After the sorted backward, in one launch: the rows of dword of words used more than once, and every
// row of dposition and dtoken_type, from their float sums; and dgamma, dbeta from the row kernel's
// partial rows. Blocks [0, C / kGradientColumns) each sum a tile of columns (parameter_gradient_
// kernel's work), the others convert rows, `row_threads` threads a row: one launch instead of two
// saves a launch gap.
template <class T, int VEC>
__global__ void __launch_bounds__(kGradientThreads)
    sorted_gradients_kernel(const SortedTokens s, const float* __restrict__ word_sums,
                            const float* __restrict__ small_sums, T* __restrict__ dword, T* __restrict__ dposition,
                            T* __restrict__ dtype, int positions, int types, int C, const float* __restrict__ partial,
                            int parts, ParameterGradients<T, 2> parameters, int row_threads, int vocab) {
  wait_for_prior_grid();  // the sums and the partial rows: launch_after_prior
  const int tiles = ceil_div(C, kGradientColumns);
  if (static_cast<int>(blockIdx.x) < tiles) {
    parameter_gradient_tile<T, 2>(partial, parts, C, parameters, blockIdx.x);
    return;
  }
  const int rows_per_block = kGradientThreads / row_threads, y = threadIdx.x / row_threads;
  if (y >= rows_per_block) return;
  sorted_table_rows<T, VEC>(s, word_sums, small_sums, dword, dposition, dtype, positions, types, C, vocab,
                            threadIdx.x % row_threads, row_threads, (blockIdx.x - tiles) * rows_per_block + y,
                            (gridDim.x - tiles) * rows_per_block);
}

template <class T>
struct TableGradientArgs {
  const int* mark;
  const int* slot;
  const float* word_sums;
  const float* small_sums;
  T* dword;
  T* dposition;
  T* dtype;
  int vocab;
  int positions;
  int types;
  int C;
};

// Writes every row of the three gradient tables once: rows of word ids not in use are zero. Thread
// (x, y) of a block: columns x * VEC.. of row y of the block's rows.
template <class T, int VEC>
__global__ void table_gradient_kernel(const TableGradientArgs<T> a) {
  wait_for_prior_grid();  // the sums: launch_after_prior
  const int total = a.vocab + a.positions + a.types, C = a.C;
  for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < total; row += gridDim.x * blockDim.y) {
    const float* from;
    T* to;
    if (row < a.vocab) {
      from = a.mark[row] ? a.word_sums + static_cast<size_t>(a.slot[row]) * C : nullptr;
      to = a.dword + static_cast<size_t>(row) * C;
    } else {
      from = a.small_sums + static_cast<size_t>(row - a.vocab) * C;
      to = row < a.vocab + a.positions ? a.dposition + static_cast<size_t>(row - a.vocab) * C
                                       : a.dtype + static_cast<size_t>(row - a.vocab - a.positions) * C;
    }
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      float v[VEC];
      if (from == nullptr) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = 0.f;
      } else if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q) {
          const float4 f = __ldcs(reinterpret_cast<const float4*>(from + c) + q);
          v[4 * q] = f.x;
          v[4 * q + 1] = f.y;
          v[4 * q + 2] = f.z;
          v[4 * q + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = from[c + k];
      }
      Vec<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[k]);
      out.store(to + c);
    }
  }
}

}  // namespace
}  // namespace fusekit::kernels
