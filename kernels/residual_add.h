// A residual addition, y = a + b elementwise (in float, rounded once to the storage type): where a
// pre-LN network's branch meets its stream (Swin's MLP output and its block input; in the backward,
// the stream's gradient and a branch's). a, b, y: `elements` values of one storage type (float,
// half, bfloat16); y may be a or b (in place). elements >= 0 (0: nothing), < 2^62.
#pragma once

#include <cuda_runtime.h>

#include "kernels/dtype.h"

namespace fusekit::kernels {

void residual_add(DType dtype, const void* a, const void* b, void* y, long long elements, cudaStream_t stream);

}  // namespace fusekit::kernels
