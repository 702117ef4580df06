// Scale, mask and softmax: what the forward and backward kernels share. A row's mask resolved from
// its (b, h, q) (Masking, RowMask), the flush-to-zero exponential and reciprocal, and the kept
// score of one key for the looping kernels.
#pragma once

#include "kernels/common.cuh"
#include "kernels/detail/fast_divide.h"
#include "kernels/softmax.h"

namespace fusekit::kernels {
// Included by softmax.cu alone: its kernels keep the anonymous namespace (and so their names in
// traces) of the one translation unit that launches them.
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// One row's mask: keys at or past `limit` are removed; `bias` and `window` point at the row's
// additive terms, or are null.
template <class T>
struct RowMask {
  int limit;
  const T* bias;
  const T* window;
};

// The mask of every row, resolved per row from its (b, h, q): row = (b * heads + h) * queries + q.
template <class T>
struct Masking {
  SoftmaxMask kind;
  const int32_t* lengths;
  const T* bias;
  const T* window_mask;
  FastDivide windows;
  FastDivide heads;
  FastDivide queries;
  int keys;

  // The mask of `row` for a mask kind known at compile time (the lane kernels), or read from `kind`.
  template <SoftmaxMask KIND>
  __device__ RowMask<T> row_of(int row) const {
    const int bh = queries.quotient(row);
    const int q = row - bh * queries.divisor;
    RowMask<T> m{keys, nullptr, nullptr};
    if constexpr (KIND == SoftmaxMask::padding) {
      m.limit = min(max(lengths[heads.quotient(bh)], 0), keys);
    } else if constexpr (KIND == SoftmaxMask::causal) {
      m.limit = min(max(q + 1 + keys - queries.divisor, 0), keys);
    } else if constexpr (KIND == SoftmaxMask::bias) {
      const int b = heads.quotient(bh);
      const int h = bh - b * heads.divisor;
      m.bias = bias + (static_cast<size_t>(h) * queries.divisor + q) * keys;
      if (window_mask) {
        const int w = b - windows.quotient(b) * windows.divisor;
        m.window = window_mask + (static_cast<size_t>(w) * queries.divisor + q) * keys;
      }
    }
    return m;
  }
  __device__ RowMask<T> row(int row) const {
    switch (kind) {
      case SoftmaxMask::padding:
        return row_of<SoftmaxMask::padding>(row);
      case SoftmaxMask::causal:
        return row_of<SoftmaxMask::causal>(row);
      case SoftmaxMask::bias:
        return row_of<SoftmaxMask::bias>(row);
      default:
        return row_of<SoftmaxMask::none>(row);
    }
  }
};

// 2^x by the special-function unit alone (denormal results flush to 0: they are below 2^-126 of
// the row's largest term, which is 1), and 1/x likewise for the row sums (at least 1).
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float reciprocal_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The kept score of key c, for the looping kernels.
template <class T>
__device__ __forceinline__ float score(const T* xr, const RowMask<T>& m, int c, float scale) {
  float z = scale * to_float(xr[c]);
  if (m.bias) z += to_float(m.bias[c]);
  if (m.window) z += to_float(m.window[c]);
  return z;
}

constexpr int kLaneKernelThreads = 256;

}  // namespace
}  // namespace fusekit::kernels
