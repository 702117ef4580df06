// Row gather and its backward, the scatter: the MLM head runs on the masked rows of the encoder's
// output only, so its input is gathered from [tokens, H] and its input gradient scattered back.
//
//   forward:  dst[j, :] = src[indices[j], :]                          j < rows_out
//   backward: dsrc[r, :] = dy[j, :] where indices[j] == r, else 0     r < rows_in  (all of dsrc written)
//
// src, dsrc: [rows_in, columns]; dst, dy: [rows_out, columns]; row-major and dense, of one storage
// type (float, half, bfloat16); the rows are copied bit for bit (no arithmetic). indices: [rows_out]
// int32, a device pointer, each in [0, rows_in) and all DISTINCT: the backward is a scatter, not a
// sum, so two equal indices leave one of their dy rows in dsrc (which one is not defined), never
// their sum (models/mlm_data.h's gathered_rows pads its rows with distinct positions for this).
// Outputs must not overlap inputs.
//
// Rows move as 16-byte vectors where columns x element size is a multiple of 16 and every pointer
// is 16-byte aligned, element by element otherwise. The backward zeroes dsrc (one memset), then
// scatters the dy rows: the rows named are written twice, which one kernel could avoid only with an
// inverse map of the indices (rows_out is about 15% of rows_in in BERT's MLM head).
//
// Out-of-range indices (< 0 or >= rows_in) touch no memory outside the tensors: the forward writes
// NaN across that dst row (visibly wrong, as PyTorch's device assert would stop), the backward
// skips that dy row (it reaches no dsrc row). The host checks only the sizes and pointers:
// rows_in, rows_out >= 0 and columns >= 1, and non-null pointers where there is something to read
// or write (std::invalid_argument otherwise). rows_out = 0 is allowed: the forward does nothing,
// the backward zeroes dsrc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace fusekit::kernels {

void gather_rows_forward(DType dtype, const void* src, const int32_t* indices, void* dst, int rows_in, int rows_out,
                         int columns, cudaStream_t stream);

void gather_rows_backward(DType dtype, const void* dy, const int32_t* indices, void* dsrc, int rows_in, int rows_out,
                          int columns, cudaStream_t stream);

}  // namespace fusekit::kernels
