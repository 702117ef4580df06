// LayerNorm of rows gathered by an index map, forward and backward: the row machinery of
// window_partition and patch_merging (kernels/swin_window.h). Output row r (of L columns) is the
// LayerNorm of the elements x[map.row(r)(c)], c < L; the backward scatters dx through the same map.
// The map is a bijection between output elements and elements of x, so every dx element has one
// writer and the backward, like the forward, walks output rows.
//
// A Map has `Row row(int r) const` on the device, and Row has `size_t operator()(int c) const`: the
// offset in x of column c of row r, for c a multiple of the vector width (a vector never spans two
// tokens: the launchers take the vector width from the token length, not from L).
//
// The row groups, register configurations and the two-stage parameter-gradient reduction are
// LayerNorm's (layernorm_common.cuh). The forward launches a row group per row at every size (no
// one-wave grid, no prefetch of the next row: both measured slower for gathered rows; layernorm.cu
// does the same at large sizes only), and there is no looping kernel for rows beyond the register
// configurations (Swin's rows are 96..3072 columns): such rows are a std::invalid_argument.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/detail/layernorm_common.cuh"

namespace fusekit::kernels::gathered_layernorm {

using namespace layernorm_rows;

// ---- CUDA kernels

// Lanes per row with up to three vectors each run at most 32 registers (8 blocks of 256 threads a
// multiprocessor): more rows in flight. Not in bfloat16, where that cap spilled.
template <class T, int NV, int TPR>
constexpr int kForwardMinBlocks = !std::is_same_v<T, __nv_bfloat16> && TPR <= kWarpSize && NV <= 3 ? 8 : 1;
template <class T, int VEC, int NV, int TPR, class Map>
__global__ void __launch_bounds__(TPR <= kWarpSize ? kLaneKernelThreads : TPR, kForwardMinBlocks<T, NV, TPR>)
    forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, T* __restrict__ y,
                   float* __restrict__ mean, float* __restrict__ rstd, int rows, int L, float eps, Map map) {
  __shared__ float scratch[kWarpSize];
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int t = rg.thread;
  // Every thread of the block runs every iteration (the reductions need the whole warp or block);
  // a row group past the last row computes on zeros and writes nothing.
  for (int first = blockIdx.x * rg.count; first < rows; first += gridDim.x * rg.count) {
    const int row = first + rg.index;
    const bool valid = row < rows;
    const auto source = map.row(valid ? row : 0);
    V in[NV];
    // Not streaming (evict-first) loads, which measured slower: probably because a 128-byte line of x
    // can hold parts of two tokens that different row groups read, and evicted first it may be read
    // twice. Loads that ask L2 for the whole 256-byte block, with the map's fast divisions and at most
    // 32 registers (above), measured faster.
    load_vectors<TPR, VEC>(in, valid, L, t, [&](int c) { return V::load_block256(x + source(c)); });
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      if (valid && (j * TPR + t) * VEC < L) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum += to_float(in[j].v[k]);
      }
    }
    const float mu = rg.sum(sum, scratch) / L;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      if (valid && (j * TPR + t) * VEC < L) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(in[j].v[k]) - mu;
          squares += d * d;
        }
      }
    }
    const float rs = rsqrtf(rg.sum(squares, scratch) / L + eps);
    T* yr = y + static_cast<size_t>(row) * L;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < L) {
        const V g = V::load(gamma + c), b = V::load(beta + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          out.v[k] = from_float<T>((to_float(in[j].v[k]) - mu) * rs * to_float(g.v[k]) + to_float(b.v[k]));
        out.store(yr + c);
      }
    }
    if (valid && t == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
}

// partial: [gridDim.x][2][L] floats: per block, sum over its rows of dy * xhat (dgamma) and dy (dbeta).
template <class T, int VEC, int NV, int TPR, class Map>
__global__ void __launch_bounds__(TPR <= kWarpSize ? kLaneKernelThreads : TPR)
    backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gamma,
                    const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                    float* __restrict__ partial, int rows, int L, Map map) {
  __shared__ float scratch[kWarpSize];
  extern __shared__ float warp_partial[];  // lanes per row: [warps][2][L], combined before the write
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int t = rg.thread;

  float acc[2][NV][VEC];  // dgamma, dbeta of this thread's columns
#pragma unroll
  for (int j = 0; j < NV; ++j) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[0][j][k] = acc[1][j][k] = 0.f;
  }
  for (int first = blockIdx.x * rg.count; first < rows; first += gridDim.x * rg.count) {
    const int row = first + rg.index;
    const bool valid = row < rows;
    const auto source = map.row(valid ? row : 0);
    const size_t offset = static_cast<size_t>(row) * L;
    const float mu = valid ? mean[row] : 0.f, rs = valid ? rstd[row] : 0.f;
    V xv[NV], dyv[NV];
    load_vectors<TPR, VEC>(xv, valid, L, t, [&](int c) { return V::load_stream(x + source(c)); });
    load_vectors<TPR, VEC>(dyv, valid, L, t, [&](int c) { return V::load_stream(dy + offset + c); });
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < L) {
        const V gv = V::load(gamma + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(dyv[j].v[k]);
          const float xhat = (to_float(xv[j].v[k]) - mu) * rs;
          const float g = __fmul_rn(d, to_float(gv.v[k]));  // rounded: both passes see the same g
          sum_g += g;
          sum_gx += g * xhat;
          acc[0][j][k] += d * xhat;
          acc[1][j][k] += d;
        }
      }
    }
    const float mean_g = rg.sum(sum_g, scratch) / L;
    const float mean_gx = rg.sum(sum_gx, scratch) / L;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < L) {
        const V gv = V::load(gamma + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float xhat = (to_float(xv[j].v[k]) - mu) * rs;
          const float g = __fmul_rn(to_float(dyv[j].v[k]), to_float(gv.v[k]));
          out.v[k] = from_float<T>(rs * (g - mean_g - xhat * mean_gx));
        }
        out.store(dx + source(c));
      }
    }
  }

  write_block_partials<2, NV, VEC, TPR>(acc, partial + static_cast<size_t>(blockIdx.x) * 2 * L, warp_partial, L, t);
}

// ---- kernel launchers

// The register configuration of a row of L elements in vectors of `vec`; throws for rows beyond them.
inline Config row_config(const char* op, int L, int vec, bool backward) {
  const Config config = backward ? choose_backward_config(L / vec) : choose_config(L / vec, 4);
  if (config.tpr == 0) {
    throw std::invalid_argument(std::string(op) + ": rows of " + std::to_string(L) +
                                " elements are longer than the register configurations hold");
  }
  return config;
}

inline size_t backward_workspace_bytes(int rows, int L) {
  return sizeof(float) * 2 * static_cast<size_t>(L) * backward_block_limit(std::max(rows, 1));
}

// vec: 1, or 16 bytes of T where every token's length and every pointer allow it.
template <class T, class Map>
void forward(const char* op, const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, int rows, int L,
             int vec, float eps, Map map, cudaStream_t stream) {
  const Config config = row_config(op, L, vec, false);
  bool launched = false;
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (NV <= 4) {  // choose_config(.., 4) never asks for more
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        // A row group per row, not one wave of resident blocks walking several rows each, as a plain copy
        // of those bytes is faster with a thread per vector than one wave (fewer rows in lockstep, no tail
        // of blocks that all finish their last row together); layernorm.cu's next-row prefetch measured
        // slower here.
        const int blocks = std::max(1, ceil_div(rows, threads / TPR));
        forward_kernel<T, VEC, NV, TPR, Map>
            <<<blocks, threads, 0, stream>>>(x, gamma, beta, y, mean, rstd, rows, L, eps, map);
        launched = true;
      }
    });
  });
  if (!launched) throw std::logic_error(std::string(op) + ": no forward kernel for the chosen configuration");
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T, class Map>
void backward(const char* op, const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx,
              T* dgamma, T* dbeta, int rows, int L, int vec, Map map, float* partial, cudaStream_t stream) {
  const Config config = row_config(op, L, vec, true);
  const int limit = backward_block_limit(rows);
  int blocks = 0;
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      // choose_backward_config gives at most 4 vectors a lane (e.g. 16 lanes x 3 for 48 vectors).
      if constexpr (NV <= 4) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const size_t shared = TPR <= kWarpSize ? sizeof(float) * 2 * L * (threads / kWarpSize) : 0;
        auto kernel = backward_kernel<T, VEC, NV, TPR, Map>;
        if (shared > 48 * 1024) {
          FUSEKIT_CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        }
        blocks =
            std::max(1, std::min({limit, resident_blocks(kernel, threads, shared), ceil_div(rows, threads / TPR)}));
        kernel<<<blocks, threads, shared, stream>>>(dy, x, gamma, mean, rstd, dx, partial, rows, L, map);
      }
    });
  });
  if (blocks == 0) throw std::logic_error(std::string(op) + ": no backward kernel for the chosen configuration");
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  launch_parameter_gradients<T, 2>(partial, blocks, L, {{dgamma, dbeta}}, stream);
}

}  // namespace fusekit::kernels::gathered_layernorm
