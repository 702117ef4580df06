// Bias + dropout + residual + LayerNorm: what the forward and backward kernels share. h formed with
// rounded operations (and recomputed element by element), the argument packs of the row kernels,
// and the kernel that writes the dropout mask for the tests.
#pragma once

#include "kernels/common.cuh"
#include "kernels/detail/layernorm_common.cuh"
#include "kernels/detail/philox.cuh"

namespace fusekit::kernels {
// Included by bias_dropout_residual_layernorm.cu alone: its kernels keep the anonymous namespace
// (and so their names in traces) of the one translation unit that launches them.
namespace {

using namespace layernorm_rows;

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

// Element c of row `base`'s h, recomputed (post-LN, or pre-LN before h is written).
template <class T>
__device__ __forceinline__ float recompute_h(const T* x, const T* bias, const T* residual, const DropoutStream& dropout,
                                             size_t base, int c) {
  const float m = dropout.multiplier(dropout.template kept_bits<1>(base + c), 0);
  return residual_sum(to_float(x[base + c]), to_float(bias[c]), to_float(residual[base + c]), m);
}

template <class T>
__global__ void dropout_mask_kernel(T* mask, size_t count, DropoutStream dropout) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x)
    mask[i] = from_float<T>(static_cast<float>(dropout.template kept_bits<1>(i) & 1u));
}

}  // namespace
}  // namespace fusekit::kernels
