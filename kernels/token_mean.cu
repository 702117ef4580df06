// Mean over tokens and its backward (see token_mean.h).
//
// Design: the forward gives each thread one (b, f) and walks the L tokens, so that a warp reads 32
// consecutive features of one token at a time (coalesced) and sums in a float register; Swin's
// head has L = 49 and B x F = 128 x 768 outputs, enough threads for the GPU. The backward is one
// thread per dx element, in dx's order.
#include "kernels/token_mean.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"

namespace fusekit::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads)
    token_mean_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int tokens, int features, long long total) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const float scale = 1.0f / static_cast<float>(tokens);
  for (long long o = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const long long b = o / features, f = o - b * features;
    const T* row = x + b * tokens * features + f;
    float sum = 0.f;
    for (int l = 0; l < tokens; ++l) sum += to_float(row[static_cast<long long>(l) * features]);
    y[o] = from_float<T>(sum * scale);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) token_mean_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx,
                                                                       int tokens, int features, long long total) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const float scale = 1.0f / static_cast<float>(tokens);
  const long long per_image = static_cast<long long>(tokens) * features;
  for (long long o = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const long long b = o / per_image, f = o % features;
    dx[o] = from_float<T>(to_float(dy[b * features + f]) * scale);
  }
}

void check(const char* op, const void* a, const void* b, int batch, int tokens, int features) {
  if (batch < 1 || tokens < 1 || features < 1) {
    throw std::invalid_argument(std::string(op) + ": sizes must be positive (got " + std::to_string(batch) + "x" +
                                std::to_string(tokens) + "x" + std::to_string(features) + ")");
  }
  if (static_cast<long long>(batch) * tokens * features > INT_MAX) {
    throw std::invalid_argument(std::string(op) + ": more than 2^31 - 1 elements");
  }
  if (a == nullptr || b == nullptr) throw std::invalid_argument(std::string(op) + ": a null pointer");
}

int blocks_for(long long total) {
  return static_cast<int>(std::min<long long>((total + kThreads - 1) / kThreads, 32LL * multiprocessors()));
}

}  // namespace

// ---- kernel launchers

void token_mean_forward(DType dtype, const void* x, void* y, int batch, int tokens, int features, cudaStream_t stream) {
  constexpr const char* op = "token_mean_forward";
  check(op, x, y, batch, tokens, features);
  const long long total = static_cast<long long>(batch) * features;
  dispatch_dtype(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    token_mean_forward_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), tokens, features, total);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void token_mean_backward(DType dtype, const void* dy, void* dx, int batch, int tokens, int features,
                         cudaStream_t stream) {
  constexpr const char* op = "token_mean_backward";
  check(op, dy, dx, batch, tokens, features);
  const long long total = static_cast<long long>(batch) * tokens * features;
  dispatch_dtype(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    token_mean_backward_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<T*>(dx), tokens, features, total);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::kernels
