// The swin_window operator's patch merging half (declared in swin_window.h): Swin's PatchMerging
// before its reduction Linear, the 2x2 gather and the LayerNorm over 4C, forward and backward, and
// the gathered_layernorm instantiations they need. It is a translation unit of its own, apart from
// swin_window.cu, only so that the two sets of LayerNorm instantiations compile in parallel.
//
// A merged token's row of 4C is gathered straight from the four tokens of x (each read whole, in
// 16-byte vectors where C allows) into the registers of its row group; the concatenation is never
// written. The backward scatters dx to the same four tokens.
#include "kernels/detail/dispatch.h"
#include "kernels/detail/gathered_layernorm.cuh"
#include "kernels/swin_window.h"

#include <climits>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
namespace {

// Merged token r = (b * H/2 + i) * W/2 + j, column c = k * C + channel: token (b, 2i + (k & 1),
// 2j + (k >> 1)) of x, i.e. x0 = x[2i, 2j], x1 = x[2i+1, 2j], x2 = x[2i, 2j+1], x3 = x[2i+1, 2j+1].
struct PatchMap {
  int height, width, channels;

  struct Row {
    size_t base;        // x[b, 2i, 2j, 0]
    size_t row_stride;  // one image row: W * C
    int channels;
    __device__ size_t operator()(int c) const {
      const int k = c / channels, channel = c - k * channels;
      return base + (k & 1) * row_stride + (k >> 1) * static_cast<size_t>(channels) + channel;
    }
  };

  __device__ Row row(int r) const {
    const int half_w = width / 2, half_h = height / 2;
    const int rest = r / half_w, j = r - rest * half_w;
    const int b = rest / half_h, i = rest - b * half_h;
    const size_t row_stride = static_cast<size_t>(width) * channels;
    return {((static_cast<size_t>(b) * height + 2 * i) * width + 2 * j) * channels, row_stride, channels};
  }
};

constexpr const char* kPatch = "patch_merging";

int merged_rows(const PatchShape& s) { return static_cast<int>(s.merged_tokens()); }

}  // namespace

void check_patch_shape(const PatchShape& s) {
  const std::string got = " (got " + std::to_string(s.batch) + "x" + std::to_string(s.height) + "x" +
                          std::to_string(s.width) + "x" + std::to_string(s.channels) + ")";
  if (s.batch <= 0 || s.height <= 0 || s.width <= 0 || s.channels <= 0) {
    throw std::invalid_argument(std::string(kPatch) + ": B, H, W and C must be positive" + got);
  }
  if (s.height % 2 != 0 || s.width % 2 != 0) {
    throw std::invalid_argument(std::string(kPatch) + ": H and W must be even" + got);
  }
  if (static_cast<long long>(s.batch) * s.height * s.width > INT_MAX || s.channels > INT_MAX / 4) {
    throw std::invalid_argument(std::string(kPatch) + ": more than 2^31 - 1 tokens or 4C" + got);
  }
}

void patch_merging_forward(DType dtype, const void* x, const void* gamma, const void* beta, void* y, float* mean,
                           float* rstd, const PatchShape& shape, float eps, cudaStream_t stream) {
  check_patch_shape(shape);
  const PatchMap map{shape.height, shape.width, shape.channels};
  dispatch_dtype(dtype, kPatch, [&](auto type) {
    using T = typename decltype(type)::type;
    const T *xt = static_cast<const T*>(x), *g = static_cast<const T*>(gamma), *b = static_cast<const T*>(beta);
    T* out = static_cast<T*>(y);
    const int vec = vector_width<T>(shape.channels, {xt, g, b, out});  // vectors within one token
    gathered_layernorm::forward<T>(kPatch, xt, g, b, out, mean, rstd, merged_rows(shape), 4 * shape.channels, vec, eps,
                                   map, stream);
  });
}

size_t patch_merging_backward_workspace_bytes(const PatchShape& shape) {
  check_patch_shape(shape);
  return gathered_layernorm::backward_workspace_bytes(merged_rows(shape), 4 * shape.channels);
}

void patch_merging_backward(DType dtype, const void* dy, const void* x, const void* gamma, const float* mean,
                            const float* rstd, void* dx, void* dgamma, void* dbeta, const PatchShape& shape,
                            void* workspace, cudaStream_t stream) {
  check_patch_shape(shape);
  const PatchMap map{shape.height, shape.width, shape.channels};
  dispatch_dtype(dtype, kPatch, [&](auto type) {
    using T = typename decltype(type)::type;
    const T *dyt = static_cast<const T*>(dy), *xt = static_cast<const T*>(x), *g = static_cast<const T*>(gamma);
    T* dxt = static_cast<T*>(dx);
    const int vec = vector_width<T>(shape.channels, {dyt, xt, g, dxt});
    gathered_layernorm::backward<T>(kPatch, dyt, xt, g, mean, rstd, dxt, static_cast<T*>(dgamma),
                                    static_cast<T*>(dbeta), merged_rows(shape), 4 * shape.channels, vec, map,
                                    static_cast<float*>(workspace), stream);
  });
}

}  // namespace fusekit::kernels
