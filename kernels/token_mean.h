// The mean over each image's tokens, Swin's (and ViT's) average pooling before the classifier head,
// forward and backward:
//
//   forward:  y[b, f] = (1 / L) sum_l x[b, l, f]         (summed in float, rounded once)
//   backward: dx[b, l, f] = dy[b, f] / L
//
// x, dx: [B, L, F]; y, dy: [B, F]; row-major, one storage type (float, half, bfloat16). Sizes must be
// positive and a tensor hold at most 2^31 - 1 elements (std::invalid_argument otherwise).
#pragma once

#include <cuda_runtime.h>

#include "kernels/dtype.h"

namespace fusekit::kernels {

void token_mean_forward(DType dtype, const void* x, void* y, int batch, int tokens, int features, cudaStream_t stream);
void token_mean_backward(DType dtype, const void* dy, void* dx, int batch, int tokens, int features,
                         cudaStream_t stream);

}  // namespace fusekit::kernels
