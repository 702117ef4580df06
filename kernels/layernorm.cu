// LayerNorm forward and backward (see layernorm.h for the math and layouts).
//
// Design: the row lives in registers. A row group of TPR threads owns one row at a time, each thread
// holding NV vectors of VEC elements (16 bytes each where C allows): TPR = 4..32 lanes of a warp per
// row (short rows: Swin's 96..192 columns take 4 or 8 lanes, so no lane idles), several rows per
// block; TPR = 128..1024 is a block per row. Mean and variance are
// two passes over the registers, so the variance never suffers the cancellation of E[x^2] - E[x]^2,
// and x is read from memory once. Rows too long for the register configurations take a looping
// kernel that re-reads the row (correct for any length, slower).
//
// The backward keeps each thread's columns fixed across the rows it visits (a grid-stride loop over
// rows), so dgamma and dbeta accumulate in registers; each block writes one partial row and a second
// kernel sums the partials. No atomics. A warp per row keeps its sums in registers too, unlike the
// fused row kernels (ColumnSums in layernorm_common.cuh): in shared memory they measured slower here.
#include "kernels/detail/dispatch.h"
#include "kernels/detail/layernorm_common.cuh"
#include "kernels/layernorm.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
namespace {

using namespace layernorm_rows;

// ---- CUDA kernels

// STREAM: y is stored streaming (evict first).
template <class T, int VEC, int NV, int TPR, bool STREAM>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                             T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int rows, int C,
                             float eps, int rows_per_group) {
  __shared__ float scratch[kWarpSize];
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  // A row group normalizes `rows_per_group` rows, a grid stride apart. The group's next row is
  // loaded while this one is reduced and written (its loads are in flight during the shuffles and
  // the stores). Not with 512 or 1024 threads a row, whose register budget it would exceed.
  constexpr bool kPrefetch = TPR <= 256;
  auto load_row = [&](V(&dst)[NV], int row) {
    const T* from = x + static_cast<size_t>(row) * C;
    load_vectors<TPR, VEC>(dst, row < rows, C, t, [&](int c) { return V::load_stream(from + c); });
  };
  const int stride = gridDim.x * groups;
  V next[NV];
  if constexpr (kPrefetch) load_row(next, blockIdx.x * groups + group);

  // Every lane of a warp runs every iteration (its shuffles need the whole warp); a row group past
  // the last row computes on zeros and writes nothing.
  int first = blockIdx.x * groups;
  for (int k = 0; k < rows_per_group && first < rows; ++k, first += stride) {
    const int row = first + group;
    const bool valid = row < rows;
    V in[NV];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int j = 0; j < NV; ++j) in[j] = next[j];
      if (k + 1 < rows_per_group) load_row(next, row + stride);
    } else {
      load_row(in, row);
    }
    // The row stays packed in its storage type (half the registers of floats for 16-bit types, so
    // more rows in flight per multiprocessor); each pass converts it again.
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      if (valid && (j * TPR + t) * VEC < C) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum += to_float(in[j].v[k]);
      }
    }
    const float mu = reduce(sum) / C;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      if (valid && (j * TPR + t) * VEC < C) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(in[j].v[k]) - mu;
          squares += d * d;
        }
      }
    }
    const float rs = rsqrtf(reduce(squares) / C + eps);
    T* yr = y + static_cast<size_t>(row) * C;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < C) {
        const V g = V::load(gamma + c), b = V::load(beta + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          out.v[k] = from_float<T>((to_float(in[j].v[k]) - mu) * rs * to_float(g.v[k]) + to_float(b.v[k]));
        if constexpr (STREAM)
          out.store_stream(yr + c);
        else
          out.store(yr + c);
      }
    }
    if (valid && t == 0 && mean != nullptr) {  // null mean and rstd: inference, nothing saved
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
}

// Any row length: a block per row, the row read three times (mean, variance, output).
template <class T>
__global__ void layernorm_forward_looping_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                                 const T* __restrict__ beta, T* __restrict__ y,
                                                 float* __restrict__ mean, float* __restrict__ rstd, int rows, int C,
                                                 float eps) {
  __shared__ float scratch[kWarpSize];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + static_cast<size_t>(row) * C;
    float sum = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += to_float(xr[c]);
    const float mu = block_sum(sum, scratch) / C;
    float squares = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) squares += (to_float(xr[c]) - mu) * (to_float(xr[c]) - mu);
    const float rs = rsqrtf(block_sum(squares, scratch) / C + eps);
    T* yr = y + static_cast<size_t>(row) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      yr[c] = from_float<T>((to_float(xr[c]) - mu) * rs * to_float(gamma[c]) + to_float(beta[c]));
    }
    if (threadIdx.x == 0 && mean != nullptr) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
}

// partial: [gridDim.x][2][C] floats: per block, sum over its rows of dy * xhat (dgamma) and dy (dbeta).
template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    layernorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                              float* __restrict__ partial, int rows, int C) {
  wait_for_prior_grid();  // launched after the forward (or whatever wrote dy): launch_after_prior
  __shared__ float scratch[kWarpSize];
  extern __shared__ float warp_partial[];  // lanes per row: [warps][2][C], combined before the write
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };

  float acc[2][NV][VEC];  // dgamma, dbeta of this thread's columns
#pragma unroll
  for (int j = 0; j < NV; ++j) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[0][j][k] = acc[1][j][k] = 0.f;
  }
  for (int first = blockIdx.x * groups; first < rows; first += gridDim.x * groups) {
    const int row = first + group;
    const bool valid = row < rows;  // as in the forward: the whole warp runs every iteration
    const size_t offset = static_cast<size_t>(row) * C;
    const float mu = valid ? mean[row] : 0.f, rs = valid ? rstd[row] : 0.f;
    // The row stays in registers in its storage type (half the registers of floats for 16-bit
    // types); xhat and g are recomputed in the second pass rather than kept.
    V xv[NV], dyv[NV];
    load_vectors<TPR, VEC>(xv, valid, C, t, [&](int c) { return V::load_stream(x + offset + c); });
    load_vectors<TPR, VEC>(dyv, valid, C, t, [&](int c) { return V::load_stream(dy + offset + c); });
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < C) {
        const V gv = V::load(gamma + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(dyv[j].v[k]);
          const float xhat = (to_float(xv[j].v[k]) - mu) * rs;
          // Rounded products (no FMA contraction), so both passes see the same g: for one column,
          // g - mean(g) is then exactly 0, as it must be.
          const float g = __fmul_rn(d, to_float(gv.v[k]));
          sum_g += g;
          sum_gx += g * xhat;
          acc[0][j][k] += d * xhat;
          acc[1][j][k] += d;
        }
      }
    }
    const float mean_g = reduce(sum_g) / C;
    const float mean_gx = reduce(sum_gx) / C;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < C) {
        const V gv = V::load(gamma + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float xhat = (to_float(xv[j].v[k]) - mu) * rs;
          const float g = __fmul_rn(to_float(dyv[j].v[k]), to_float(gv.v[k]));
          out.v[k] = from_float<T>(rs * (g - mean_g - xhat * mean_gx));
        }
        out.store(dx + offset + c);
      }
    }
  }

  write_block_partials<2, NV, VEC, TPR>(acc, partial + static_cast<size_t>(blockIdx.x) * 2 * C, warp_partial, C, t);
}

// Any row length: a block per row; the block's partial row accumulates in global memory, which only
// this block touches.
template <class T>
__global__ void layernorm_backward_looping_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                  const T* __restrict__ gamma, const float* __restrict__ mean,
                                                  const float* __restrict__ rstd, T* __restrict__ dx,
                                                  float* __restrict__ partial, int rows, int C) {
  __shared__ float scratch[kWarpSize];
  float* block_partial = partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) block_partial[c] = 0.f;
  __syncthreads();  // another thread may have zeroed the entries this one accumulates
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const size_t offset = static_cast<size_t>(row) * C;
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = to_float(dy[offset + c]), xh = (to_float(x[offset + c]) - mu) * rs;
      const float g = d * to_float(gamma[c]);
      sum_g += g;
      sum_gx += g * xh;
      block_partial[c] += d * xh;  // each column has one owner thread, in every row
      block_partial[C + c] += d;
    }
    const float mean_g = block_sum(sum_g, scratch) / C;
    const float mean_gx = block_sum(sum_gx, scratch) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xh = (to_float(x[offset + c]) - mu) * rs;
      const float g = to_float(dy[offset + c]) * to_float(gamma[c]);
      dx[offset + c] = from_float<T>(rs * (g - mean_g - xh * mean_gx));
    }
  }
}

// ---- kernel launchers

// The forward's configuration: the fewest lanes per row that hold it in at most 3 vectors a lane,
// else choose_config's (measured faster than fewer lanes with more vectors each).
Config choose_forward_config(int vectors) {
  for (int tpr : {4, 8, 16, 32}) {
    if (vectors <= tpr * 3) return {tpr, ceil_div(vectors, tpr)};
  }
  return choose_config(vectors, 8);
}

// Rows per row group: one (a grid of every row: the best at large sizes, where one resident wave
// walking the rows lost 5-9% to it) unless that grid is under four waves, where two rows a group
// (the second prefetched) measured best.
int forward_rows_per_group(int blocks_for_every_row, int resident) {
  return blocks_for_every_row >= 4 * resident ? 1 : 2;
}

// An inference forward (no mean and rstd to write) stores y streaming (evict first) where y is larger
// than L2, which it cannot stay in until it is read anyway, and takes blocks of one warp over a grid
// of every row. The training forward keeps 256 threads and plain stores: with the statistics saved,
// both measured slower.
struct ForwardLaunch {
  int threads;
  bool stream;
};
ForwardLaunch forward_launch(bool inference, bool y_past_l2, int rows_per_group, int tpr) {
  const int lane_threads = inference && rows_per_group == 1 ? kWarpSize : kLaneKernelThreads;
  return {tpr > kWarpSize ? tpr : lane_threads, inference && y_past_l2};
}

template <class T>
void forward_typed(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, int rows, int C,
                   float eps, cudaStream_t stream) {
  const int vec = vector_width<T>(C, {x, gamma, beta, y});
  const Config config = choose_forward_config(C / vec);
  const bool y_past_l2 = larger_than_l2(static_cast<size_t>(rows) * C * sizeof(T));
  auto launch = [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
      static const int resident = resident_blocks(layernorm_forward_kernel<T, VEC, NV, TPR, false>, threads);
      const int per_group = forward_rows_per_group(ceil_div(rows, threads / TPR), resident);
      const ForwardLaunch l = forward_launch(mean == nullptr, y_past_l2, per_group, TPR);
      const int blocks = ceil_div(rows, l.threads / TPR * per_group);
      auto kernel =
          l.stream ? layernorm_forward_kernel<T, VEC, NV, TPR, true> : layernorm_forward_kernel<T, VEC, NV, TPR, false>;
      kernel<<<blocks, l.threads, 0, stream>>>(x, gamma, beta, y, mean, rstd, rows, C, eps, per_group);
    });
    if (!done) {
      const int blocks = std::min(rows, 64 * multiprocessors());
      layernorm_forward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(x, gamma, beta, y, mean, rstd, rows, C, eps);
    }
  };
  dispatch_vector_width<T>(vec, launch);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx, T* dgamma,
                    T* dbeta, int rows, int C, float* partial, cudaStream_t stream) {
  const int vec = vector_width<T>(C, {dy, x, gamma, dx});
  const Config config = choose_backward_config(C / vec);
  const int limit = backward_block_limit(rows);
  int blocks = limit;
  auto launch = [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (NV <= 4) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const size_t shared = TPR <= kWarpSize ? sizeof(float) * 2 * C * (threads / kWarpSize) : 0;
        auto kernel = layernorm_backward_kernel<T, VEC, NV, TPR>;
        if (shared > 48 * 1024) {
          FUSEKIT_CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        }
        blocks =
            std::max(1, std::min({limit, resident_blocks(kernel, threads, shared), ceil_div(rows, threads / TPR)}));
        launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, dy, x, gamma, mean, rstd, dx, partial,
                           rows, C);
      }
    });
    if (!done) {
      layernorm_backward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(dy, x, gamma, mean, rstd, dx, partial, rows, C);
    }
  };
  dispatch_vector_width<T>(vec, launch);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  launch_parameter_gradients<T, 2>(partial, blocks, C, {{dgamma, dbeta}}, stream);
}

void check_sizes(int rows, int C) {
  if (rows < 0 || C <= 0) {
    throw std::invalid_argument("layernorm: rows must be >= 0 and columns > 0 (got " + std::to_string(rows) + " x " +
                                std::to_string(C) + ")");
  }
}

}  // namespace

void layernorm_forward(DType dtype, const void* x, const void* gamma, const void* beta, void* y, float* mean,
                       float* rstd, int rows, int columns, float eps, cudaStream_t stream) {
  check_sizes(rows, columns);
  if ((mean == nullptr) != (rstd == nullptr)) {
    throw std::invalid_argument("layernorm: mean and rstd are both given (training) or both null (inference)");
  }
  if (rows == 0) return;
  dispatch_dtype(dtype, "layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    forward_typed<T>(static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta),
                     static_cast<T*>(y), mean, rstd, rows, columns, eps, stream);
  });
}

size_t layernorm_backward_workspace_bytes(int rows, int columns) {
  check_sizes(rows, columns);
  return sizeof(float) * 2 * static_cast<size_t>(columns) * backward_block_limit(std::max(rows, 1));
}

void layernorm_backward(DType dtype, const void* dy, const void* x, const void* gamma, const float* mean,
                        const float* rstd, void* dx, void* dgamma, void* dbeta, int rows, int columns, void* workspace,
                        cudaStream_t stream) {
  check_sizes(rows, columns);
  dispatch_dtype(dtype, "layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    backward_typed<T>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(gamma), mean, rstd,
                      static_cast<T*>(dx), static_cast<T*>(dgamma), static_cast<T*>(dbeta), rows, columns,
                      static_cast<float*>(workspace), stream);
  });
}

}  // namespace fusekit::kernels
