// Bias + dropout + residual + LayerNorm forward: the register row kernel (row groups of TPR
// threads) and the looping kernel for rows beyond the register configurations.
#pragma once

#include "kernels/detail/bias_dropout_residual_layernorm_common.cuh"

namespace fusekit::kernels {
// Included by bias_dropout_residual_layernorm.cu alone: its kernels keep the anonymous namespace
// (and so their names in traces) of the one translation unit that launches them.
namespace {

using namespace layernorm_rows;

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

}  // namespace
}  // namespace fusekit::kernels
