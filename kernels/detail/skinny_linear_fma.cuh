// The skinny linear kernels for fp32: forward and backward with FMA, W^T in shared memory as
// float4 columns.
#pragma once

#include "kernels/detail/skinny_linear_common.cuh"

namespace fusekit::kernels {
// Included by skinny_linear.cu alone: its kernels keep the anonymous namespace (and so their names
// in traces) of the one translation unit that launches them.
namespace {

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

}  // namespace
}  // namespace fusekit::kernels
