// Swin's window partition (LayerNorm + cyclic shift + partition) and window merge (reverse +
// reverse shift + residual add), forward and backward (see swin_window.h for the maps and layouts).
//
// Design: nothing is materialized between the steps; every kernel walks window rows and finds the
// token a window row comes from with WindowMap, so the window tensor is written (or read)
// contiguously and each token row is read (or written) whole, in 16-byte vectors where C allows.
// The partition's LayerNorm is gathered_layernorm.cuh (LayerNorm's row groups and two-stage
// dgamma/dbeta); the merge and its backward are one vector per thread, a thread per vector.
#include "kernels/detail/dispatch.h"
#include "kernels/detail/fast_divide.h"
#include "kernels/detail/gathered_layernorm.cuh"
#include "kernels/swin_window.h"

#include <climits>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
namespace {

// Window row r -> its token of x: r = ((b * windows_h + wh) * windows_w + ww) * ws^2 + i * ws + j
// comes from token (b, (wh * ws + i + shift) % H, (ww * ws + j + shift) % W).
struct WindowMap {
  int height, width, window, shift, channels;
  // Divisions by launch-wide constants as a multiply-high and a shift (fast_divide.h): the
  // partition forward at Swin-T stage 1 computes this map once per 4 lanes per row, and its four
  // integer divisions were about a fifth of the kernel's instructions.
  FastDivide area, columns, windows_w, windows_h;

  struct Row {
    size_t base;
    __device__ size_t operator()(int c) const { return base + c; }
  };

  __device__ size_t token(int r) const {
    const int index = area.quotient(r), p = r - index * area.divisor;
    const int i = columns.quotient(p), j = p - i * window;
    const int rest = windows_w.quotient(index), ww = index - rest * windows_w.divisor;
    const int b = windows_h.quotient(rest), wh = rest - b * windows_h.divisor;
    int h = wh * window + i + shift, w = ww * window + j + shift;  // shift < window <= H, W: one wrap at most
    if (h >= height) h -= height;
    if (w >= width) w -= width;
    return (static_cast<size_t>(b) * height + h) * width + w;
  }
  __device__ Row row(int r) const { return {token(r) * channels}; }
};

WindowMap window_map(const WindowShape& s) {
  return {s.height,
          s.width,
          s.window,
          s.shift,
          s.channels,
          FastDivide(s.window * s.window),
          FastDivide(s.window),
          FastDivide(s.width / s.window),
          FastDivide(s.height / s.window)};
}

// ---- CUDA kernels (the partition's LayerNorm kernels are gathered_layernorm.cuh's)

// y[token(r)] = shortcut[token(r)] + windows[r], one vector of VEC channels per thread and step.
// shortcut and y may alias (one thread reads, then writes, each element), so neither is __restrict__.
// STREAM: y is stored streaming (evict first).
template <class T, int VEC, bool STREAM>
__global__ void window_merge_forward_kernel(const T* __restrict__ windows, const T* shortcut, T* y, int rows, int C,
                                            WindowMap map) {
  using V = Vec<T, VEC>;
  const int per_row = C / VEC;
  const size_t total = static_cast<size_t>(rows) * per_row;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    const int r = static_cast<int>(i / per_row);
    const int c = static_cast<int>(i - static_cast<size_t>(r) * per_row) * VEC;
    const size_t token = map.token(r) * C + c;
    const V w = V::load_stream(windows + static_cast<size_t>(r) * C + c);
    const V s = V::load_stream(shortcut + token);
    V out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(to_float(w.v[k]) + to_float(s.v[k]));
    if constexpr (STREAM)
      out.store_stream(y + token);
    else
      out.store(y + token);
  }
}

// dwindows[r] = dy[token(r)]: the partition without LayerNorm and without arithmetic.
template <class T, int VEC>
__global__ void window_merge_backward_kernel(const T* __restrict__ dy, T* __restrict__ dwindows, int rows, int C,
                                             WindowMap map) {
  using V = Vec<T, VEC>;
  const int per_row = C / VEC;
  const size_t total = static_cast<size_t>(rows) * per_row;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total; i += size_t{gridDim.x} * blockDim.x) {
    const int r = static_cast<int>(i / per_row);
    const int c = static_cast<int>(i - static_cast<size_t>(r) * per_row) * VEC;
    V::load_stream(dy + map.token(r) * C + c).store(dwindows + static_cast<size_t>(r) * C + c);
  }
}

// ---- kernel launchers

constexpr int kMergeThreads = 256;

// A thread per vector (the grid-stride loop only past the grid's limit), not one wave of resident
// blocks looping, as a plain copy of those bytes shows (84% of the copy ceiling with a thread per
// vector at Swin-T stage 1, 70% one wave of one vector a thread). Row groups holding 4 vectors of
// each operand a lane (the token index once per row) measured slower.
int merge_blocks(const WindowShape& s, int vec) {
  const size_t vectors = static_cast<size_t>(s.tokens()) * (s.channels / vec);
  const size_t wanted = (vectors + kMergeThreads - 1) / kMergeThreads;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(wanted, INT_MAX)));
}

// A y larger than L2 cannot stay there until it is read: the forward stores it streaming (evict
// first).
template <class T>
void merge_forward_typed(const T* windows, const T* shortcut, T* y, const WindowShape& s, cudaStream_t stream) {
  const int vec = vector_width<T>(s.channels, {windows, shortcut, y});
  const int rows = static_cast<int>(s.tokens());
  const bool stream_y = larger_than_l2(static_cast<size_t>(s.tokens()) * s.channels * sizeof(T));
  layernorm_rows::dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    auto kernel = stream_y ? window_merge_forward_kernel<T, VEC, true> : window_merge_forward_kernel<T, VEC, false>;
    kernel<<<merge_blocks(s, VEC), kMergeThreads, 0, stream>>>(windows, shortcut, y, rows, s.channels, window_map(s));
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void merge_backward_typed(const T* dy, T* dwindows, const WindowShape& s, cudaStream_t stream) {
  const int vec = vector_width<T>(s.channels, {dy, dwindows});
  const int rows = static_cast<int>(s.tokens());
  layernorm_rows::dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    window_merge_backward_kernel<T, VEC>
        <<<merge_blocks(s, VEC), kMergeThreads, 0, stream>>>(dy, dwindows, rows, s.channels, window_map(s));
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

constexpr const char* kPartition = "window_partition";
constexpr const char* kMerge = "window_merge";

}  // namespace

void check_window_shape(const char* op, const WindowShape& s) {
  const std::string got = " (got " + std::to_string(s.batch) + "x" + std::to_string(s.height) + "x" +
                          std::to_string(s.width) + "x" + std::to_string(s.channels) + ", window " +
                          std::to_string(s.window) + ", shift " + std::to_string(s.shift) + ")";
  if (s.batch <= 0 || s.height <= 0 || s.width <= 0 || s.channels <= 0 || s.window <= 0) {
    throw std::invalid_argument(std::string(op) + ": B, H, W, C and the window size must be positive" + got);
  }
  if (s.height % s.window != 0 || s.width % s.window != 0) {
    throw std::invalid_argument(std::string(op) + ": H and W must be multiples of the window size" + got);
  }
  if (s.shift < 0 || s.shift >= s.window) {
    throw std::invalid_argument(std::string(op) + ": the shift must be in [0, window size)" + got);
  }
  if (s.tokens() > INT_MAX) {
    throw std::invalid_argument(std::string(op) + ": more than 2^31 - 1 tokens" + got);
  }
}

void window_partition_forward(DType dtype, const void* x, const void* gamma, const void* beta, void* windows,
                              float* mean, float* rstd, const WindowShape& shape, float eps, cudaStream_t stream) {
  check_window_shape(kPartition, shape);
  dispatch_dtype(dtype, kPartition, [&](auto type) {
    using T = typename decltype(type)::type;
    const T *xt = static_cast<const T*>(x), *g = static_cast<const T*>(gamma), *b = static_cast<const T*>(beta);
    T* out = static_cast<T*>(windows);
    const int vec = vector_width<T>(shape.channels, {xt, g, b, out});
    gathered_layernorm::forward<T>(kPartition, xt, g, b, out, mean, rstd, static_cast<int>(shape.tokens()),
                                   shape.channels, vec, eps, window_map(shape), stream);
  });
}

size_t window_partition_backward_workspace_bytes(const WindowShape& shape) {
  check_window_shape(kPartition, shape);
  return gathered_layernorm::backward_workspace_bytes(static_cast<int>(shape.tokens()), shape.channels);
}

void window_partition_backward(DType dtype, const void* dwindows, const void* x, const void* gamma, const float* mean,
                               const float* rstd, void* dx, void* dgamma, void* dbeta, const WindowShape& shape,
                               void* workspace, cudaStream_t stream) {
  check_window_shape(kPartition, shape);
  dispatch_dtype(dtype, kPartition, [&](auto type) {
    using T = typename decltype(type)::type;
    const T *dyt = static_cast<const T*>(dwindows), *xt = static_cast<const T*>(x), *g = static_cast<const T*>(gamma);
    T* dxt = static_cast<T*>(dx);
    const int vec = vector_width<T>(shape.channels, {dyt, xt, g, dxt});
    gathered_layernorm::backward<T>(kPartition, dyt, xt, g, mean, rstd, dxt, static_cast<T*>(dgamma),
                                    static_cast<T*>(dbeta), static_cast<int>(shape.tokens()), shape.channels, vec,
                                    window_map(shape), static_cast<float*>(workspace), stream);
  });
}

void window_merge_forward(DType dtype, const void* windows, const void* shortcut, void* y, const WindowShape& shape,
                          cudaStream_t stream) {
  check_window_shape(kMerge, shape);
  dispatch_dtype(dtype, kMerge, [&](auto type) {
    using T = typename decltype(type)::type;
    merge_forward_typed<T>(static_cast<const T*>(windows), static_cast<const T*>(shortcut), static_cast<T*>(y), shape,
                           stream);
  });
}

void window_merge_backward(DType dtype, const void* dy, void* dwindows, const WindowShape& shape, cudaStream_t stream) {
  check_window_shape(kMerge, shape);
  dispatch_dtype(dtype, kMerge, [&](auto type) {
    using T = typename decltype(type)::type;
    merge_backward_typed<T>(static_cast<const T*>(dy), static_cast<T*>(dwindows), shape, stream);
  });
}

}  // namespace fusekit::kernels
