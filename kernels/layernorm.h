// LayerNorm over the last dimension, forward and backward.
//
//   forward:  mean_r = sum_c x[r,c] / C,  rstd_r = 1 / sqrt(sum_c (x[r,c] - mean_r)^2 / C + eps)
//             y[r,c] = (x[r,c] - mean_r) * rstd_r * gamma[c] + beta[c]
//   backward: xhat = (x - mean) * rstd,  g = dy * gamma
//             dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
//             dgamma[c] = sum_r dy * xhat,  dbeta[c] = sum_r dy
//
// x, y, dy, dx: [rows, C] row-major; gamma, beta, dgamma, dbeta: [C]; all of one storage type
// (float, half or bfloat16). mean and rstd: [rows] float, saved by the forward for the backward;
// both null for inference (nothing saved; y is the same to the bit).
// Arithmetic is in float. dgamma and dbeta are reduced in two stages without atomics: per-block
// partial sums into `workspace`, then one pass over the partials.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/dtype.h"

namespace fusekit::kernels {

void layernorm_forward(DType dtype, const void* x, const void* gamma, const void* beta, void* y, float* mean,
                       float* rstd, int rows, int columns, float eps, cudaStream_t stream);

// Bytes of float workspace layernorm_backward needs for these sizes.
size_t layernorm_backward_workspace_bytes(int rows, int columns);

void layernorm_backward(DType dtype, const void* dy, const void* x, const void* gamma, const float* mean,
                        const float* rstd, void* dx, void* dgamma, void* dbeta, int rows, int columns, void* workspace,
                        cudaStream_t stream);

}  // namespace fusekit::kernels
