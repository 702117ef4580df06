// The linear layer's "skinny" path (internal to linear.cu): kernels of its own for shapes whose stored
// extents are at most 64, unpadded with a feature size that is not a multiple of 8 (where cuBLASLt
// would run its align-1 kernels) or padded (kernels/linear.h says why). Same math, same operands,
// bias epilogue only; the backward adds per-block partials of dW and db in a fixed order (the same
// bits on every run on one device).
#pragma once

#include <cuda_runtime.h>

#include "kernels/dtype.h"
#include "kernels/linear.h"

namespace fusekit::kernels {

constexpr int kSkinnyMaxFeatures = 64;

// True where linear_forward (bias epilogue) and linear_backward take the skinny kernels: extents of at
// most 64 where cuBLASLt would run unaligned kernels (a feature size not a multiple of 8) or the
// shape is padded (Swin's 49 -> 56: the kernels then run over the padded extents, as the GEMMs would;
// measured on the H100 against cuBLASLt on the same padded sizes).
inline bool linear_uses_skinny_path(const LinearShape& shape) {
  return (shape.padded || shape.out_features % 8 != 0 || shape.in_features % 8 != 0) &&
         shape.out_stride() <= kSkinnyMaxFeatures && shape.in_stride() <= kSkinnyMaxFeatures;
}

// The unpadded shape the skinny kernels compute: the extents the operands are stored with.
inline LinearShape skinny_extents(const LinearShape& shape) {
  return {shape.rows, shape.out_stride(), shape.in_stride(), false};
}

// y = x W^T + b, for an unpadded shape (skinny_extents) with features <= 64.
void skinny_linear_forward(DType dtype, const LinearShape& shape, const void* x, const void* weight, const void* bias,
                           void* y, cudaStream_t stream);

// dx = dy W (dx null: skipped), dW = dy^T x, db = sum_rows(dy) (dbias null: skipped). The per-block
// partials live in context.scratch(2).
void skinny_linear_backward(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                            const void* x, const void* weight, void* dx, void* dweight, void* dbias,
                            cudaStream_t stream);

}  // namespace fusekit::kernels
