// bias + GELU, forward and backward, fused: the GEMM output of a Transformer's first FFN layer
// goes through its bias and the activation in one pass, and back in one pass.
//
//   forward:  z = x + bias[c],  y = gelu(z)
//   backward: dx = dy * gelu'(z)          (z recomputed from x and bias: nothing else is saved)
//             dbias[c] = sum_r dx[r, c]
//   erf form: gelu(z) = z/2 * (1 + erf(z / sqrt 2)),  gelu'(z) = Phi(z) + z * phi(z)
//   tanh:     gelu(z) = z/2 * (1 + tanh(k (z + a z^3))), k = sqrt(2/pi), a = 0.044715
//
// x, y, dy, dx: [rows, C] row-major; bias, dbias: [C]; all one storage type (float, half,
// bfloat16), arithmetic in float: z is never rounded to the storage type, which PyTorch eager does
// between its two kernels. dbias is reduced in two stages without atomics: per-block column sums
// into `workspace`, then one pass over them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/dtype.h"

namespace fusekit::kernels {

enum class GeluApproximation { none, tanh };  // as PyTorch's approximate="none" | "tanh"

void bias_gelu_forward(DType dtype, GeluApproximation approximation, const void* x, const void* bias, void* y, int rows,
                       int columns, cudaStream_t stream);

// Bytes of workspace bias_gelu_backward needs for these sizes.
size_t bias_gelu_backward_workspace_bytes(int rows, int columns);

void bias_gelu_backward(DType dtype, GeluApproximation approximation, const void* dy, const void* x, const void* bias,
                        void* dx, void* dbias, int rows, int columns, void* workspace, cudaStream_t stream);

}  // namespace fusekit::kernels
