// Embedding + LayerNorm backward for rows the sorted backward does not take: word ids marked and
// given compact accumulator slots, then the register row kernel (or, for long rows, the looping
// kernel) adding de with float atomics into its word's slot and its position's row.
#pragma once

#include "kernels/detail/embedding_layernorm_common.cuh"

namespace fusekit::kernels {
// Included by embedding_layernorm.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

// mark[word id] = 1 for every token whose ids are in range.
__global__ void mark_words_kernel(Lookup lookup, int rows, int* mark) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    const TokenIds ids = lookup.at(r);
    if (ids.in_range) mark[ids.word] = 1;
  }
}

// slot[v] for every marked v: 0, 1, ... from `counter` (zeroed with the marks), one atomicAdd per
// warp. Unmarked entries are left as they are (no reader looks at them).
__global__ void word_slots_kernel(const int* __restrict__ mark, int* __restrict__ slot, int n, int* counter) {
  wait_for_prior_grid();  // the marks: launch_after_prior
  const int lane = threadIdx.x % kWarpSize;
  for (int first = blockIdx.x * blockDim.x; first < n; first += gridDim.x * blockDim.x) {
    const int v = first + threadIdx.x;  // the whole warp runs every iteration (its ballot needs it)
    const bool marked = v < n && mark[v] != 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, marked);
    if (ballot == 0) continue;
    int base = 0;
    if (lane == 0) base = atomicAdd(counter, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (marked) slot[v] = base + __popc(ballot & ((1u << lane) - 1u));
  }
}

template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    embedding_layernorm_backward_kernel(const BackwardArgs<T> a) {
  wait_for_prior_grid();  // the slots: launch_after_prior
  __shared__ float scratch[kWarpSize];
  extern __shared__ float dynamic_shared[];  // [warps][2][C] (lanes per row), then [types][C] type sums
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = a.C;
  const int types = a.lookup.types, positions = a.lookup.positions;
  float* type_sums = a.type_sums_offset >= 0 ? dynamic_shared + a.type_sums_offset : nullptr;
  if (type_sums) {
    for (int i = threadIdx.x; i < types * C; i += blockDim.x) type_sums[i] = 0.f;
    __syncthreads();
  }

  // dgamma, dbeta of this thread's columns; a warp per row keeps them in shared memory (ColumnSums).
  ColumnSums<2, NV, VEC, TPR, TPR == kWarpSize> sums(dynamic_shared, C);
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const TokenIds ids = row < a.rows ? a.lookup.at(row) : TokenIds{0, 0, 0, false};
    const bool valid = row < a.rows && ids.in_range;  // out of range: no gradient at all
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = valid ? a.mean[row] : 0.f, rs = valid ? a.rstd[row] : 0.f;
    // e in float and the kept flags stay in registers; dy is loaded again by the second pass (plain
    // loads, so it is an L1 hit) rather than held, which keeps bf16 rows of 768 free of spills.
    float ev[NV][VEC];
    uint32_t kept[NV];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      kept[j] = 0;
      if (valid && c < C) {
        kept[j] = a.dropout.template kept_bits<VEC>(base + c);
        const V w = V::load(a.tables.word + ids.word * C + c);
        const V p = V::load(a.tables.position + ids.position * C + c);
        const V ty = V::load(a.tables.type + ids.type * C + c);
        const V dyv = V::load(a.dy + base + c);
        const V gv = V::load(a.gamma + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          ev[j][k] = embedding_sum(to_float(w.v[k]), to_float(p.v[k]), to_float(ty.v[k]));
          const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept[j], k));
          const float xhat = (ev[j][k] - mu) * rs;
          // Rounded products, so both passes see the same g (no FMA contraction in one of them).
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
    if (valid) {
      float* word_to = a.word_sums + static_cast<size_t>(a.slot[ids.word]) * C;
      float* position_to = a.small_sums + static_cast<size_t>(ids.position) * C;
      float* type_to =
          type_sums ? type_sums + ids.type * C : a.small_sums + static_cast<size_t>(positions + ids.type) * C;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        if (c < C) {
          const V gv = V::load(a.gamma + c), dyv = V::load(a.dy + base + c);
          float de[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept[j], k));
            const float xhat = (ev[j][k] - mu) * rs;
            const float g = __fmul_rn(d, to_float(gv.v[k]));
            de[k] = rs * (g - mean_g - xhat * mean_gx);
          }
          add_floats<VEC>(word_to + c, de);
          add_floats<VEC>(position_to + c, de);
          if (type_sums) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              if constexpr (RowGroups<TPR>::kLanesPerRow)
                atomicAdd(type_to + c + k, de[k]);  // the block's warps share the rows
              else
                type_to[c + k] += de[k];  // the block is on one row: each column has one owner thread
            }
          } else {
            add_floats<VEC>(type_to + c, de);
          }
        }
      }
    }
  }

  sums.write(a.partial + static_cast<size_t>(blockIdx.x) * 2 * C, dynamic_shared, C, t);
  if (type_sums) {
    __syncthreads();
    float* to = a.small_sums + static_cast<size_t>(positions) * C;
    for (int i = threadIdx.x; i < types * C; i += blockDim.x) {
      if (type_sums[i] != 0.f) atomicAdd(to + i, type_sums[i]);
    }
  }
}

// Any row length: a block per row. The block's partial rows accumulate in global memory, which only
// this block touches (each column has one owner thread in every row); de goes straight to the
// accumulators.
template <class T>
__global__ void embedding_layernorm_backward_looping_kernel(const BackwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  float* block_partial = a.partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) block_partial[c] = 0.f;
  __syncthreads();
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const TokenIds ids = a.lookup.at(row);
    if (!ids.in_range) continue;  // the whole block takes this branch
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = a.mean[row], rs = a.rstd[row];
    auto d_at = [&](int c) {
      return __fmul_rn(to_float(a.dy[base + c]), a.dropout.multiplier(a.dropout.template kept_bits<1>(base + c), 0));
    };
    float sum_g = 0.f, sum_gx = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = d_at(c), xhat = (a.tables.e_at(ids, C, c) - mu) * rs;
      const float g = __fmul_rn(d, to_float(a.gamma[c]));
      sum_g += g;
      sum_gx += g * xhat;
      block_partial[c] += d * xhat;
      block_partial[C + c] += d;
    }
    const float mean_g = block_sum(sum_g, scratch) / C;
    const float mean_gx = block_sum(sum_gx, scratch) / C;
    float* word_to = a.word_sums + static_cast<size_t>(a.slot[ids.word]) * C;
    float* position_to = a.small_sums + static_cast<size_t>(ids.position) * C;
    float* type_to = a.small_sums + static_cast<size_t>(a.lookup.positions + ids.type) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (a.tables.e_at(ids, C, c) - mu) * rs;
      const float g = __fmul_rn(d_at(c), to_float(a.gamma[c]));
      const float de = rs * (g - mean_g - xhat * mean_gx);
      atomicAdd(word_to + c, de);
      atomicAdd(position_to + c, de);
      atomicAdd(type_to + c, de);
    }
  }
}

}  // namespace
}  // namespace fusekit::kernels
