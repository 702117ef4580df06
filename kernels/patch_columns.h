// The image patches of a patch embedding as GEMM rows (im2col for a convolution whose stride equals
// its kernel, as Swin's and ViT's 4x4 / 16x16 stride-4 / stride-16 Conv2d): the convolution is then
// columns x W^T + b with W the Conv2d weight [C, in_channels, patch, patch] viewed as [C, K].
//
//   columns[(b, i, j), (c, y, x)] = images[b, c, i * patch + y, j * patch + x]
//   rows: (b, i, j) row-major over the batch and the patch grid (H / patch) x (W / patch), which is
//         the channels-last token order [B, H / patch, W / patch, C] the GEMM's output then has;
//   columns: (c, y, x) row-major, K = in_channels x patch x patch, the order the weight flattens in.
//
// images: [B, in_channels, H, W] (NCHW, PyTorch's); columns: [B x (H / patch) x (W / patch), K]; one
// storage type (float, half, bfloat16). A copy: values move bit for bit. Forward only: a network's
// input images take no gradient. H and W must be multiples of patch (std::invalid_argument
// otherwise, and for sizes < 1 or more than 2^31 - 1 elements).
#pragma once

#include <cuda_runtime.h>

#include "kernels/dtype.h"

namespace fusekit::kernels {

struct PatchColumnsShape {
  int batch;
  int channels;  // in_channels
  int height;
  int width;
  int patch;
  long long rows() const { return static_cast<long long>(batch) * (height / patch) * (width / patch); }
  int columns() const { return channels * patch * patch; }
};

void patch_columns_forward(DType dtype, const void* images, void* columns, const PatchColumnsShape& shape,
                           cudaStream_t stream);

}  // namespace fusekit::kernels
