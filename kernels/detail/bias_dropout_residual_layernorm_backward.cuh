// Bias + dropout + residual + LayerNorm backward: the register row kernel, the kernel for rows of
// exactly one vector a thread of a block (R rows at once, the next R copied ahead into shared
// memory), and the looping kernel for rows beyond the register configurations.
#pragma once

#include "kernels/detail/bias_dropout_residual_layernorm_common.cuh"
#include "kernels/detail/mma_fragments.cuh"

namespace fusekit::kernels {
// Included by bias_dropout_residual_layernorm.cu alone: its kernels keep the anonymous namespace
// (and so their names in traces) of the one translation unit that launches them.
namespace {

using namespace layernorm_rows;

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

}  // namespace
}  // namespace fusekit::kernels
