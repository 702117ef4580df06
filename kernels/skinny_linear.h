// The linear layer's "skinny" path (internal to linear.cu): kernels of its own for unpadded shapes
// whose feature sizes are at most 64 and not both multiples of 8, where cuBLASLt would run its
// align-1 kernels (kernels/linear.h says why and what was measured). Same math, same operands, bias
// epilogue only; the backward is deterministic (per-block partials of dW and db, then a reduction).
#pragma once

#include <cuda_runtime.h>

#include "kernels/dtype.h"
#include "kernels/linear.h"

namespace fusekit::kernels {

constexpr int kSkinnyMaxFeatures = 64;

// True where linear_forward (bias epilogue) and linear_backward take the skinny kernels.
inline bool linear_uses_skinny_path(const LinearShape& shape) {
  return !shape.padded && (shape.out_features % 8 != 0 || shape.in_features % 8 != 0) &&
         shape.out_features <= kSkinnyMaxFeatures && shape.in_features <= kSkinnyMaxFeatures;
}

// y = x W^T + b.
void skinny_linear_forward(DType dtype, const LinearShape& shape, const void* x, const void* weight, const void* bias,
                           void* y, cudaStream_t stream);

// dx = dy W (dx null: skipped), dW = dy^T x, db = sum_rows(dy) (dbias null: skipped). The per-block
// partials live in context.scratch(2).
void skinny_linear_backward(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                            const void* x, const void* weight, void* dx, void* dweight, void* dbias,
                            cudaStream_t stream);

}  // namespace fusekit::kernels
