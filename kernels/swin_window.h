// Swin Transformer's window operations as pure index maps, forward and backward, with no
// intermediate tensors: three operators that share one map and one LayerNorm row kernel.
//
// Layouts: tokens channels-last, x, shortcut, y, dx: [B, H, W, C]; windows: [B * nW, ws * ws, C]
// with nW = (H / ws) * (W / ws), window (b, wh, ww) at index (b * H / ws + wh) * W / ws + ww and
// its token (i, j) at i * ws + j. All tensors of one storage type (float, half or bfloat16); the
// arithmetic is in float; mean and rstd are float.
//
// The window map (Swin's torch.roll(x, (-shift, -shift), (1, 2)) followed by window_partition):
//   window row r = window (b, wh, ww), token (i, j)  <->  token (b, (wh*ws + i + shift) % H,
//                                                               (ww*ws + j + shift) % W) of x.
//
// window_partition:  windows[r] = LayerNorm(x[source(r)]; gamma, beta)          (gamma, beta: [C])
//   backward:        dx[source(r)] = LayerNorm backward of dwindows[r]; dgamma, dbeta: [C]
// window_merge:      y[source(r)] = shortcut[source(r)] + windows[r]
//                    (= shortcut + torch.roll(window_reverse(windows), (shift, shift), (1, 2)))
//   backward:        dwindows[r] = dy[source(r)];  dshortcut IS dy: nothing is written for it,
//                    the caller uses dy itself (an alias, as autograd's add returns it too).
// patch_merging:     y[b, i, j, :] = LayerNorm(cat(x[b, 2i, 2j], x[b, 2i+1, 2j], x[b, 2i, 2j+1],
//                    x[b, 2i+1, 2j+1]); gamma, beta)   (Swin's PatchMerging order x0, x1, x2, x3;
//                    y: [B, H/2, W/2, 4C], gamma, beta: [4C])
//   backward:        dx (every token of x belongs to exactly one merged token), dgamma, dbeta
//
// mean and rstd are saved per OUTPUT row: per window token ([B * H * W], in window order) for
// window_partition, per merged token ([B * H/2 * W/2]) for patch_merging. dgamma and dbeta are
// reduced in two stages without atomics, as layernorm_backward does, in `workspace`.
//
// Shapes that the maps do not cover throw std::invalid_argument with one line saying why.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/dtype.h"

namespace fusekit::kernels {

struct WindowShape {
  int batch;     // B
  int height;    // H, a multiple of window
  int width;     // W, a multiple of window
  int channels;  // C
  int window;    // ws: 7 (Swin-T/S/B at 224) or 12 (Swin-B/L at 384); any ws >= 1 works
  int shift;     // 0 or ws / 2 in Swin; any 0 <= shift < ws works

  long long tokens() const { return static_cast<long long>(batch) * height * width; }
};

// Throws std::invalid_argument (naming `op`) unless the shape is one the window map covers.
void check_window_shape(const char* op, const WindowShape& shape);

void window_partition_forward(DType dtype, const void* x, const void* gamma, const void* beta, void* windows,
                              float* mean, float* rstd, const WindowShape& shape, float eps, cudaStream_t stream);

// Bytes of float workspace window_partition_backward needs for this shape.
size_t window_partition_backward_workspace_bytes(const WindowShape& shape);

void window_partition_backward(DType dtype, const void* dwindows, const void* x, const void* gamma, const float* mean,
                               const float* rstd, void* dx, void* dgamma, void* dbeta, const WindowShape& shape,
                               void* workspace, cudaStream_t stream);

// y may not alias windows; it may alias shortcut (each element is read, then written, by one thread).
void window_merge_forward(DType dtype, const void* windows, const void* shortcut, void* y, const WindowShape& shape,
                          cudaStream_t stream);

// Writes dwindows only: the gradient of shortcut is dy itself.
void window_merge_backward(DType dtype, const void* dy, void* dwindows, const WindowShape& shape, cudaStream_t stream);

struct PatchShape {
  int batch;     // B
  int height;    // H, even
  int width;     // W, even
  int channels;  // C of x; y has 4C

  long long merged_tokens() const { return static_cast<long long>(batch) * (height / 2) * (width / 2); }
};

void check_patch_shape(const PatchShape& shape);

void patch_merging_forward(DType dtype, const void* x, const void* gamma, const void* beta, void* y, float* mean,
                           float* rstd, const PatchShape& shape, float eps, cudaStream_t stream);

size_t patch_merging_backward_workspace_bytes(const PatchShape& shape);

void patch_merging_backward(DType dtype, const void* dy, const void* x, const void* gamma, const float* mean,
                            const float* rstd, void* dx, void* dgamma, void* dbeta, const PatchShape& shape,
                            void* workspace, cudaStream_t stream);

}  // namespace fusekit::kernels
