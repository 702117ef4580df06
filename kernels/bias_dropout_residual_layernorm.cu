// Bias + dropout + residual + LayerNorm forward and backward (see bias_dropout_residual_layernorm.h
// for the math, the two orders and the layouts).
//
// Design: LayerNorm's kernels (layernorm.cu) with the epilogue folded into their loads. The row lives
// in registers in the configurations of layernorm_common.cuh; a thread draws the dropout words of its
// own vectors (one Philox call per 8 elements), so the mask costs arithmetic, never memory. h is
// formed in float with rounded operations (no FMA contraction), so the backward's recomputation of
// h in post-LN is bit for bit the forward's. The backward keeps each thread's columns fixed across
// its rows, so dgamma, dbeta and dbias accumulate in registers (a warp per row: in shared memory, see
// ColumnSums); each block writes one partial row of each and a second kernel sums the partials. No atomics.
// Rows too long for the register configurations (forward: 4096 vectors; backward: 1024, i.e. 8192 16-bit or 4096 float
// columns) take looping kernels that recompute h per pass (correct for any length, slower).
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/layernorm_common.cuh"
#include "kernels/detail/mma_fragments.cuh"
#include "kernels/detail/philox.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
namespace {

using namespace layernorm_rows;

// The dropout of one call, as the kernels see it.

// h = residual + (x + bias) * m with rounded operations: the forward and the backward's
// recomputation must agree to the bit.
__device__ __forceinline__ float residual_sum(float x, float bias, float residual, float m) {
  return __fadd_rn(residual, __fmul_rn(__fadd_rn(x, bias), m));
}

template <class T>
struct ForwardArgs {
  const T* x;
  const T* bias;
  const T* residual;
  const T* gamma;
  const T* beta;
  T* h;  // written in pre-LN
  T* y;
  float* mean;
  float* rstd;
  int rows;
  int C;
  float eps;
  bool pre_ln;
  DropoutStream dropout;
};

template <class T>
struct BackwardArgs {
  const T* dy;
  const T* dh_extra;  // pre-LN, may be null
  const T* h;         // pre-LN
  const T* x;         // post-LN
  const T* bias;      // post-LN
  const T* residual;  // post-LN
  const T* gamma;
  const float* mean;
  const float* rstd;
  T* dx;
  T* dresidual;
  float* partial;  // [gridDim.x][3][C]: per block, sums of dy * xhat (dgamma), dy (dbeta), dx (dbias)
  int rows;
  int C;
  bool pre_ln;
  DropoutStream dropout;
};

// ---- CUDA kernels

template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    bias_dropout_residual_layernorm_forward_kernel(const ForwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = a.C;

  // Every lane of a warp runs every iteration (its shuffles need the whole warp); a row group past
  // the last row computes on zeros and writes nothing.
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const bool valid = row < a.rows;
    const size_t base = static_cast<size_t>(row) * C;
    float v[NV][VEC];
    // With 4 lanes a row, the row's loads are issued before their first use (load_vectors); with 16
    // lanes or a warp a row that measured slower. 8 lanes a row is unmeasured: it keeps the old loop.
    constexpr bool kLoadsFirst = TPR <= 4;
    V x_in[NV], r_in[NV];
    if constexpr (kLoadsFirst) {
      load_vectors<TPR, VEC>(x_in, valid, C, t, [&](int c) { return V::load_stream(a.x + base + c); });
      load_vectors<TPR, VEC>(r_in, valid, C, t, [&](int c) { return V::load_stream(a.residual + base + c); });
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < C) {
        const V xv = loaded_or_load<kLoadsFirst>(x_in[j], a.x + base + c);
        const V rv = loaded_or_load<kLoadsFirst>(r_in[j], a.residual + base + c);
        const V bv = V::load(a.bias + c);
        const uint32_t kept = a.dropout.template kept_bits<VEC>(base + c);
        V hv;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          float h =
              residual_sum(to_float(xv.v[k]), to_float(bv.v[k]), to_float(rv.v[k]), a.dropout.multiplier(kept, k));
          if (a.pre_ln) {  // normalize the h that is written
            hv.v[k] = from_float<T>(h);
            h = to_float(hv.v[k]);
          }
          v[j][k] = h;
          sum += h;
        }
        if (a.pre_ln) hv.store(a.h + base + c);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[j][k] = 0.f;
      }
    }
    const float mu = reduce(sum) / C;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      if (valid && (j * TPR + t) * VEC < C) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) squares += (v[j][k] - mu) * (v[j][k] - mu);
      }
    }
    const float rs = rsqrtf(reduce(squares) / C + a.eps);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < C) {
        const V g = V::load(a.gamma + c), b = V::load(a.beta + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          out.v[k] = from_float<T>((v[j][k] - mu) * rs * to_float(g.v[k]) + to_float(b.v[k]));
        out.store(a.y + base + c);
      }
    }
    if (valid && t == 0) {
      a.mean[row] = mu;
      a.rstd[row] = rs;
    }
  }
}

// Element c of row `base`'s h, recomputed (post-LN, or pre-LN before h is written).
template <class T>
__device__ __forceinline__ float recompute_h(const T* x, const T* bias, const T* residual, const DropoutStream& dropout,
                                             size_t base, int c) {
  const float m = dropout.multiplier(dropout.template kept_bits<1>(base + c), 0);
  return residual_sum(to_float(x[base + c]), to_float(bias[c]), to_float(residual[base + c]), m);
}

// Any row length: a block per row. Pass one forms h (and writes it in pre-LN); the later passes
// read it back (pre-LN: this thread's own writes) or recompute it.
template <class T>
__global__ void bias_dropout_residual_layernorm_forward_looping_kernel(const ForwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * C;
    auto h_at = [&](int c) {
      return a.pre_ln ? to_float(a.h[base + c]) : recompute_h(a.x, a.bias, a.residual, a.dropout, base, c);
    };
    float sum = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float h = recompute_h(a.x, a.bias, a.residual, a.dropout, base, c);
      if (a.pre_ln) {
        a.h[base + c] = from_float<T>(h);
        h = to_float(a.h[base + c]);
      }
      sum += h;
    }
    const float mu = block_sum(sum, scratch) / C;
    float squares = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) squares += (h_at(c) - mu) * (h_at(c) - mu);
    const float rs = rsqrtf(block_sum(squares, scratch) / C + a.eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      a.y[base + c] = from_float<T>((h_at(c) - mu) * rs * to_float(a.gamma[c]) + to_float(a.beta[c]));
    if (threadIdx.x == 0) {
      a.mean[row] = mu;
      a.rstd[row] = rs;
    }
  }
}

template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    bias_dropout_residual_layernorm_backward_kernel(const BackwardArgs<T> a) {
  wait_for_prior_grid();  // launch_after_prior
  __shared__ float scratch[kWarpSize];
  extern __shared__ float warp_partial[];  // lanes per row: [warps][3][C] (ColumnSums)
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = a.C;
  const bool has_extra = a.dh_extra != nullptr;

  // dgamma, dbeta, dbias of this thread's columns; a warp per row keeps them in shared memory.
  ColumnSums<3, NV, VEC, TPR, TPR == kWarpSize> sums(warp_partial, C);
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const bool valid = row < a.rows;  // as in the forward: the whole warp runs every iteration
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = valid ? a.mean[row] : 0.f, rs = valid ? a.rstd[row] : 0.f;
    // h in float (post-LN recomputes it in float, as the forward normalized it), dy in its storage
    // type, the kept flags as bits; xhat and g are recomputed in the second pass rather than kept.
    float hv[NV][VEC];
    V dyv[NV];
    uint32_t kept[NV];
    // With up to 2 vectors a lane, the row's loads (h, or x and residual; dy) are issued before their
    // first use (load_vectors); with 3 and 4 vectors a lane the registers it takes made it slower.
    constexpr bool kLoadsFirst = NV <= 2;
    V x_in[NV], r_in[NV];  // pre-LN: h in x_in
    if constexpr (kLoadsFirst) {
      load_vectors<TPR, VEC>(x_in, valid, C, t,
                             [&](int c) { return V::load_stream((a.pre_ln ? a.h : a.x) + base + c); });
      if (!a.pre_ln)
        load_vectors<TPR, VEC>(r_in, valid, C, t, [&](int c) { return V::load_stream(a.residual + base + c); });
      load_vectors<TPR, VEC>(dyv, valid, C, t, [&](int c) { return V::load_stream(a.dy + base + c); });
    }
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      kept[j] = 0;
      if (valid && c < C) {
        kept[j] = a.dropout.template kept_bits<VEC>(base + c);
        if (a.pre_ln) {
          const V in = loaded_or_load<kLoadsFirst>(x_in[j], a.h + base + c);
#pragma unroll
          for (int k = 0; k < VEC; ++k) hv[j][k] = to_float(in.v[k]);
        } else {
          const V xv = loaded_or_load<kLoadsFirst>(x_in[j], a.x + base + c);
          const V rv = loaded_or_load<kLoadsFirst>(r_in[j], a.residual + base + c);
          const V bv = V::load(a.bias + c);
#pragma unroll
          for (int k = 0; k < VEC; ++k)
            hv[j][k] =
                residual_sum(to_float(xv.v[k]), to_float(bv.v[k]), to_float(rv.v[k]), a.dropout.multiplier(kept[j], k));
        }
        if constexpr (!kLoadsFirst) dyv[j] = V::load_stream(a.dy + base + c);
        const V gv = V::load(a.gamma + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(dyv[j].v[k]);
          const float xhat = (hv[j][k] - mu) * rs;
          // Rounded products (no FMA contraction), so both passes see the same g: for one column,
          // g - mean(g) is then exactly 0, as it must be.
          const float g = __fmul_rn(d, to_float(gv.v[k]));
          sum_g += g;
          sum_gx += g * xhat;
          sums.add(0, j, k, d * xhat);
          sums.add(1, j, k, d);
        }
      }
    }
    const float mean_g = reduce(sum_g) / C;
    const float mean_gx = reduce(sum_gx) / C;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (valid && c < C) {
        const V gv = V::load(a.gamma + c);
        V extra;
        if (has_extra) extra = V::load_stream(a.dh_extra + base + c);
        V dres, dxo;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float xhat = (hv[j][k] - mu) * rs;
          const float g = __fmul_rn(to_float(dyv[j].v[k]), to_float(gv.v[k]));
          float dh = rs * (g - mean_g - xhat * mean_gx);
          if (has_extra) dh += to_float(extra.v[k]);
          const float d = dh * a.dropout.multiplier(kept[j], k);
          sums.add(2, j, k, d);
          dres.v[k] = from_float<T>(dh);
          dxo.v[k] = from_float<T>(d);
        }
        dres.store(a.dresidual + base + c);
        dxo.store(a.dx + base + c);
      }
    }
  }

  sums.write(a.partial + static_cast<size_t>(blockIdx.x) * 3 * C, warp_partial, C, t);
}

// Rows of exactly TPB vectors (BERT-large's 1024 columns of 16-bit types): a block of TPB threads
// takes R rows at once, a vector of each a thread. The operands of the block's next R rows are
// copied into shared memory (cp.async, each thread its own vectors, so no barrier guards them) while
// this batch computes: the loads never stop for the math, the reductions or the stores, and the
// buffers cost no registers. The dropout flags are drawn while the batch's copies land; the 2R row
// sums of the block go through one barrier (a double-buffered exchange), and dgamma, dbeta, dbias
// stay in registers. Rows go to blocks as before (block b: rows bR.., then a grid of R rows on), so
// the partial rows are the same sums in the same order. Three buffers, or 5 blocks an SM, measured
// no faster; nor did the forward built the same way.
template <class T, int VEC, int TPB, int R>
__global__ void __launch_bounds__(TPB) bias_dropout_residual_layernorm_backward_rows_kernel(const BackwardArgs<T> a) {
  wait_for_prior_grid();  // launch_after_prior
  constexpr int kWarps = TPB / kWarpSize;
  using V = Vec<T, VEC>;
  // [buffer][row][operand][thread]: operand 0 is x (post-LN) or h (pre-LN), 1 the residual (post-LN)
  // or dh_extra (pre-LN, when given), 2 dy.
  __shared__ V staged[2][R][3][TPB];
  __shared__ float exchange[2][kWarps][2 * R];
  const int t = threadIdx.x, lane = t % kWarpSize, warp = t / kWarpSize;
  const int c = t * VEC;  // this thread's columns, the same in every row
  constexpr int C = TPB * VEC;
  const bool has_extra = a.pre_ln && a.dh_extra != nullptr;
  const T* first_operand = a.pre_ln ? a.h : a.x;
  const T* second_operand = a.pre_ln ? a.dh_extra : a.residual;  // null: pre-LN without dh_extra
  const V gv = V::load(a.gamma + c);
  V bv;
  if (!a.pre_ln) bv = V::load(a.bias + c);
  ColumnSums<3, 1, VEC, TPB, false> sums(nullptr, C);
  const int stride = gridDim.x * R;
  // Copies the operands of rows first.. into buffer b (one commit group, empty past the last row).
  auto stage = [&](int first, int b) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = first + r;
      if (row < a.rows) {
        const size_t base = static_cast<size_t>(row) * C + c;
        copy_async16(&staged[b][r][0][t], first_operand + base);
        if (second_operand != nullptr) copy_async16(&staged[b][r][1][t], second_operand + base);
        copy_async16(&staged[b][r][2][t], a.dy + base);
      }
    }
    copy_async_commit();
  };
  int buffer = 0, parity = 0;
  stage(blockIdx.x * R, 0);
  for (int first = blockIdx.x * R; first < a.rows; first += stride) {
    stage(first + stride, buffer ^ 1);  // the buffer the last batch read into registers
    float mu[R], rs[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = first + r;
      mu[r] = row < a.rows ? a.mean[row] : 0.f;
      rs[r] = row < a.rows ? a.rstd[row] : 0.f;
    }
    uint32_t kept[R];
#pragma unroll
    for (int r = 0; r < R; ++r) kept[r] = a.dropout.template kept_bits<VEC>(static_cast<size_t>(first + r) * C + c);
    copy_async_wait<1>();  // this batch's group (the next one may still fly)
    V x_in[R], r_in[R], dyv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      x_in[r] = staged[buffer][r][0][t];
      if (second_operand != nullptr) r_in[r] = staged[buffer][r][1][t];
      dyv[r] = staged[buffer][r][2][t];
    }
    float hv[R][VEC];
    float part[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float sum_g = 0.f, sum_gx = 0.f;
      if (first + r < a.rows) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          hv[r][k] = a.pre_ln ? to_float(x_in[r].v[k])
                              : residual_sum(to_float(x_in[r].v[k]), to_float(bv.v[k]), to_float(r_in[r].v[k]),
                                             a.dropout.multiplier(kept[r], k));
          const float d = to_float(dyv[r].v[k]);
          const float xhat = (hv[r][k] - mu[r]) * rs[r];
          const float g = __fmul_rn(d, to_float(gv.v[k]));  // rounded, as in the warp kernel
          sum_g += g;
          sum_gx += g * xhat;
          sums.add(0, 0, k, d * xhat);
          sums.add(1, 0, k, d);
        }
      }
      part[2 * r] = warp_sum(sum_g);
      part[2 * r + 1] = warp_sum(sum_gx);
    }
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < 2 * R; ++i) exchange[parity][warp][i] = part[i];
    }
    __syncthreads();  // exchange[parity] is written again two batches on, after the next barrier
#pragma unroll
    for (int i = 0; i < 2 * R; ++i) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += exchange[parity][w][i];
      part[i] = total / C;
    }
    parity ^= 1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = first + r;
      if (row >= a.rows) continue;
      const size_t base = static_cast<size_t>(row) * C + c;
      V dres, dxo;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float xhat = (hv[r][k] - mu[r]) * rs[r];
        const float g = __fmul_rn(to_float(dyv[r].v[k]), to_float(gv.v[k]));
        float dh = rs[r] * (g - part[2 * r] - xhat * part[2 * r + 1]);
        if (has_extra) dh += to_float(r_in[r].v[k]);
        const float d = dh * a.dropout.multiplier(kept[r], k);
        sums.add(2, 0, k, d);
        dres.v[k] = from_float<T>(dh);
        dxo.v[k] = from_float<T>(d);
      }
      dres.store(a.dresidual + base);
      dxo.store(a.dx + base);
    }
    buffer ^= 1;
  }
  copy_async_wait<0>();  // no copy outlives the block
  sums.write(a.partial + static_cast<size_t>(blockIdx.x) * 3 * C, nullptr, C, t);
}

// Any row length: a block per row; the block's partial rows accumulate in global memory, which only
// this block touches (each column has one owner thread, in every row).
template <class T>
__global__ void bias_dropout_residual_layernorm_backward_looping_kernel(const BackwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  float* block_partial = a.partial + static_cast<size_t>(blockIdx.x) * 3 * C;
  for (int c = threadIdx.x; c < 3 * C; c += blockDim.x) block_partial[c] = 0.f;
  __syncthreads();  // another thread may have zeroed the entries this one accumulates
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = a.mean[row], rs = a.rstd[row];
    auto h_at = [&](int c) {
      return a.pre_ln ? to_float(a.h[base + c]) : recompute_h(a.x, a.bias, a.residual, a.dropout, base, c);
    };
    float sum_g = 0.f, sum_gx = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = to_float(a.dy[base + c]), xhat = (h_at(c) - mu) * rs;
      const float g = __fmul_rn(d, to_float(a.gamma[c]));
      sum_g += g;
      sum_gx += g * xhat;
      block_partial[c] += d * xhat;
      block_partial[C + c] += d;
    }
    const float mean_g = block_sum(sum_g, scratch) / C;
    const float mean_gx = block_sum(sum_gx, scratch) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (h_at(c) - mu) * rs;
      const float g = __fmul_rn(to_float(a.dy[base + c]), to_float(a.gamma[c]));
      float dh = rs * (g - mean_g - xhat * mean_gx);
      if (a.dh_extra != nullptr) dh += to_float(a.dh_extra[base + c]);
      const float d = dh * a.dropout.multiplier(a.dropout.template kept_bits<1>(base + c), 0);
      block_partial[2 * C + c] += d;
      a.dresidual[base + c] = from_float<T>(dh);
      a.dx[base + c] = from_float<T>(d);
    }
  }
}

template <class T>
__global__ void dropout_mask_kernel(T* mask, size_t count, DropoutStream dropout) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x)
    mask[i] = from_float<T>(static_cast<float>(dropout.template kept_bits<1>(i) & 1u));
}

// ---- kernel launchers

// The backward holds four floats per element (h and three parameter-gradient accumulators): with
// more than 256 threads a block (at most 128 registers each) they would spill, so longer rows take
// the looping kernel.
constexpr int kBackwardMaxThreadsPerRow = 256;

template <class T>
void forward_typed(const ForwardArgs<T>& a, cudaStream_t stream) {
  const int vec = vector_width<T>(a.C, {a.x, a.bias, a.residual, a.gamma, a.beta, a.h, a.y});
  Config config = choose_row_config(a.C / vec, 1024, vec);
  // Rows of 97..128 vectors (1024 16-bit columns): a block of 64 threads a row, two vectors each,
  // not a warp of four, which measured slower. At 768 columns (96 vectors) a warp per row stays
  // faster.
  const bool pair_rows = vec > 1 && a.C / vec > 3 * kWarpSize && a.C / vec <= 4 * kWarpSize;
  if (pair_rows) config = {2 * kWarpSize, 2};
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    auto launch = [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (kRowConfigBuilt<VEC, NV>) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const int rows_per_block = threads / TPR;
        const int blocks = std::min(ceil_div(a.rows, rows_per_block), 64 * multiprocessors());
        bias_dropout_residual_layernorm_forward_kernel<T, VEC, NV, TPR><<<blocks, threads, 0, stream>>>(a);
      }
    };
    bool done = true;
    if (pair_rows)
      launch(std::integral_constant<int, 2 * kWarpSize>{}, std::integral_constant<int, 2>{});
    else
      done = dispatch_config(config, launch);
    if (!done) {
      const int blocks = std::min(a.rows, 64 * multiprocessors());
      bias_dropout_residual_layernorm_forward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(a);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(BackwardArgs<T> a, T* dgamma, T* dbeta, T* dbias, cudaStream_t stream) {
  const int vec = vector_width<T>(a.C, {a.dy, a.dh_extra, a.h, a.x, a.bias, a.residual, a.gamma, a.dx, a.dresidual});
  Config config = choose_row_config(a.C / vec, kBackwardMaxThreadsPerRow, vec);
  if (vec > 1 && config.tpr > 0 && config.tpr <= kWarpSize) config = choose_backward_config(a.C / vec);
  // Rows of 33..96 vectors: a block per row, one vector a thread, the sums in registers
  // (block_row_config), which measured faster than a warp per row with its sums in shared memory. At
  // 1024 columns one row a block was no faster or slower; rows of 128 vectors take two rows a block
  // instead (bias_dropout_residual_layernorm_backward_rows_kernel), other rows of 97 vectors and more
  // keep the warp.
  const bool block_rows = vec > 1 && a.C / vec > kWarpSize && a.C / vec <= 3 * kWarpSize;
  if (block_rows) config = block_row_config(a.C / vec);
  const int limit = backward_block_limit(a.rows);
  int blocks = limit;
  constexpr int kRowsTPB = 128, kRowsAtOnce = 2;
  if (vec > 1 && a.C / vec == kRowsTPB) {
    // Rows of 128 vectors (1024 16-bit columns): bias_dropout_residual_layernorm_backward_rows_kernel.
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      if constexpr (VEC > 1) {
        auto kernel = bias_dropout_residual_layernorm_backward_rows_kernel<T, VEC, kRowsTPB, kRowsAtOnce>;
        blocks = std::max(
            1, std::min({limit, resident_blocks(kernel, kRowsTPB), ceil_div(std::max(a.rows, 1), kRowsAtOnce)}));
        launch_after_prior(kernel, dim3(blocks), dim3(kRowsTPB), 0, stream, a);
      }
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    launch_parameter_gradients<T, 3>(a.partial, blocks, a.C, {{dgamma, dbeta, dbias}}, stream);
    return;
  }
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    auto launch = [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (TPR <= kBackwardMaxThreadsPerRow && kRowConfigBuilt<VEC, NV>) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const size_t shared = TPR <= kWarpSize ? sizeof(float) * 3 * a.C * (threads / kWarpSize) : 0;
        auto kernel = bias_dropout_residual_layernorm_backward_kernel<T, VEC, NV, TPR>;
        if (shared > 48 * 1024) {
          FUSEKIT_CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        }
        // As many blocks as fit on the GPU at once (one wave: each block's partial row is written
        // once, after all its rows), within the limit the workspace was sized for.
        const int rows_per_block = threads / TPR;
        blocks = std::max(1, std::min({limit, resident_blocks(kernel, threads, shared),
                                       ceil_div(std::max(a.rows, 1), rows_per_block)}));
        launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, a);
      }
    };
    const bool done = dispatch_block_row_config(config, launch) || dispatch_config(config, launch);
    if (!done) bias_dropout_residual_layernorm_backward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(a);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  launch_parameter_gradients<T, 3>(a.partial, blocks, a.C, {{dgamma, dbeta, dbias}}, stream);
}

void check_sizes(int rows, int C) {
  if (rows < 0 || C <= 0) {
    throw std::invalid_argument("bias_dropout_residual_layernorm: rows must be >= 0 and columns > 0 (got " +
                                std::to_string(rows) + " x " + std::to_string(C) + ")");
  }
}

void check_dropout(Dropout dropout) {
  if (!(dropout.p >= 0.f && dropout.p < 1.f)) {
    throw std::invalid_argument("bias_dropout_residual_layernorm: dropout probability must be in [0, 1) (got " +
                                std::to_string(dropout.p) + ")");
  }
}

void require(bool present, const char* what) {
  if (!present) throw std::invalid_argument(std::string("bias_dropout_residual_layernorm: ") + what);
}

}  // namespace

void bias_dropout_residual_layernorm_forward(DType dtype, ResidualOrder order,
                                             const BiasDropoutResidualForwardTensors& tensors, Dropout dropout,
                                             int rows, int columns, float eps, cudaStream_t stream) {
  check_sizes(rows, columns);
  check_dropout(dropout);
  const bool pre_ln = order == ResidualOrder::pre_ln;
  require(tensors.x && tensors.bias && tensors.residual && tensors.gamma && tensors.beta && tensors.y && tensors.mean &&
              tensors.rstd,
          "forward needs x, bias, residual, gamma, beta, y, mean and rstd");
  require(!pre_ln || tensors.h, "pre-LN forward writes h: pass it");
  if (rows == 0) return;
  dispatch_dtype(dtype, "bias_dropout_residual_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    const ForwardArgs<T> args{static_cast<const T*>(tensors.x),
                              static_cast<const T*>(tensors.bias),
                              static_cast<const T*>(tensors.residual),
                              static_cast<const T*>(tensors.gamma),
                              static_cast<const T*>(tensors.beta),
                              pre_ln ? static_cast<T*>(tensors.h) : nullptr,
                              static_cast<T*>(tensors.y),
                              tensors.mean,
                              tensors.rstd,
                              rows,
                              columns,
                              eps,
                              pre_ln,
                              dropout_stream(dropout.p, dropout.seed, dropout.offset)};
    forward_typed<T>(args, stream);
  });
}

size_t bias_dropout_residual_layernorm_backward_workspace_bytes(int rows, int columns) {
  check_sizes(rows, columns);
  return sizeof(float) * 3 * static_cast<size_t>(columns) * backward_block_limit(std::max(rows, 1));
}

void bias_dropout_residual_layernorm_backward(DType dtype, ResidualOrder order,
                                              const BiasDropoutResidualBackwardTensors& tensors, Dropout dropout,
                                              int rows, int columns, void* workspace, cudaStream_t stream) {
  check_sizes(rows, columns);
  check_dropout(dropout);
  const bool pre_ln = order == ResidualOrder::pre_ln;
  require(tensors.dy && tensors.gamma && tensors.mean && tensors.rstd && tensors.dx && tensors.dresidual &&
              tensors.dbias && tensors.dgamma && tensors.dbeta && workspace,
          "backward needs dy, gamma, mean, rstd, dx, dresidual, dbias, dgamma, dbeta and a workspace");
  if (pre_ln) {
    require(tensors.h, "pre-LN backward reads the forward's h: pass it");
  } else {
    require(tensors.x && tensors.bias && tensors.residual, "post-LN backward recomputes h: pass x, bias and residual");
    require(!tensors.dh_extra, "post-LN has no h output, so no dh_extra: pass none");
  }
  dispatch_dtype(dtype, "bias_dropout_residual_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    const BackwardArgs<T> args{static_cast<const T*>(tensors.dy),
                               static_cast<const T*>(tensors.dh_extra),
                               pre_ln ? static_cast<const T*>(tensors.h) : nullptr,
                               pre_ln ? nullptr : static_cast<const T*>(tensors.x),
                               pre_ln ? nullptr : static_cast<const T*>(tensors.bias),
                               pre_ln ? nullptr : static_cast<const T*>(tensors.residual),
                               static_cast<const T*>(tensors.gamma),
                               tensors.mean,
                               tensors.rstd,
                               static_cast<T*>(tensors.dx),
                               static_cast<T*>(tensors.dresidual),
                               static_cast<float*>(workspace),
                               rows,
                               columns,
                               pre_ln,
                               dropout_stream(dropout.p, dropout.seed, dropout.offset)};
    backward_typed<T>(args, static_cast<T*>(tensors.dgamma), static_cast<T*>(tensors.dbeta),
                      static_cast<T*>(tensors.dbias), stream);
  });
}

void bias_dropout_residual_layernorm_mask(DType dtype, Dropout dropout, void* mask, int rows, int columns,
                                          cudaStream_t stream) {
  check_sizes(rows, columns);
  check_dropout(dropout);
  const size_t count = static_cast<size_t>(rows) * columns;
  if (count == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>((count + 255) / 256, 64 * multiprocessors()));
  dispatch_dtype(dtype, "bias_dropout_residual_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    dropout_mask_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(mask), count,
                                                       dropout_stream(dropout.p, dropout.seed, dropout.offset));
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::kernels
