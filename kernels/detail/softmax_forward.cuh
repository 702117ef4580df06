// Scale, mask and softmax forward: the register row kernel (the mask kind, and Swin's 49 keys,
// compiled in) and the looping kernel for rows beyond the register configurations.
#pragma once

#include "kernels/detail/softmax_common.cuh"

namespace fusekit::kernels {
// Included by softmax.cu alone: its kernels keep the anonymous namespace (and so their names in
// traces) of the one translation unit that launches them.
namespace {

// KIND: the mask kind, compiled in, so that a row's mask costs only what its kind needs. KEYS > 0:
// the key count compiled in, for the bias mask only (it removes no key, so every row keeps KEYS):
// Swin's window-7 rows of 49 keys, where a known count removes each element's bounds test (see the
// top of softmax.cu).
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

}  // namespace
}  // namespace fusekit::kernels
