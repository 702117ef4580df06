// The linear layer for skinny shapes: K, N <= 64 (Swin's 49-token window GEMMs), unpadded with a
// feature size that is not a multiple of 8, where every row is only 2-byte aligned and cuBLASLt runs
// its align-1 kernels, or padded (run over the padded extents; evidence/h100/notes/linear.md has the
// numbers). This file holds the launchers; the kernels live under kernels/detail/
// (skinny_linear_mma.cuh for fp16/bf16, skinny_linear_fma.cuh for fp32, skinny_linear_common.cuh).
// The GEMMs are memory bound, so the kernels are built around the bytes:
//
//   forward:  y = x W^T + b
//   backward: dx = dy W,  dW = dy^T x,  db = sum_rows(dy)
//
// x: [M, K], W: [N, K], b: [N], y, dy: [M, N], dx: [M, K], row-major and dense. A tile of R
// consecutive rows (R * sizeof(T) a multiple of 16 bytes: 256 or 128 rows of 16-bit types, 64 of
// fp32) is one contiguous byte range of x, of y, of dy and of dx, and with a 16-byte aligned base
// every tile's range starts 16-byte aligned whatever K and N are.
// So a block copies whole tiles with 16-byte vectors (cp.async, double-buffered: the next tile loads
// while this one computes), the last tile's tail element by element, into shared memory, where the
// rows sit densely packed (row r at r * K); the mma fragments are gathered from there with 16-bit
// loads, zero outside the matrix. Outputs are staged the same way and leave as 16-byte vectors.
// A base that is not 16-byte aligned falls back to element copies (a run-time flag, same kernel).
//
// fp16/bf16: mma.sync m16n8k16 with float accumulators; the weight, zero-padded to K_pad, N_pad in
// {32, 64} (template parameters), sits in shared memory in fragment order (one 8-byte load per lane
// per mma). fp32: plain FMA (never TF32), the weight in shared memory.
//
// Backward: one kernel reads each tile of dy and x once and writes dx for the tile, while every
// block accumulates dW and db for the rows it visited in registers (dW with mma over the tile's rows,
// db as the product of dy^T with a column of ones); each block writes its partial sums once, and
// layernorm_rows::parameter_gradient_kernel adds the blocks' partials in a fixed order: no atomics,
// and the same bits on every run on one device (the rows' split into partials follows the grid: one
// wave of resident blocks, so the device's multiprocessor count and occupancy).
#include "kernels/detail/skinny_linear.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/layernorm_common.cuh"
#include "kernels/detail/skinny_linear_common.cuh"
#include "kernels/detail/skinny_linear_fma.cuh"
#include "kernels/detail/skinny_linear_mma.cuh"

namespace fusekit::kernels {
namespace {

// ---- kernel launchers

// Calls FN with the compile-time padded sizes K_pad, N_pad in {32, 64}.
template <class FN>
void dispatch_padded_sizes(int K, int N, FN&& fn) {
  static_assert(kSkinnyMaxFeatures <= 64, "the kernels are instantiated for padded sizes 32 and 64 only");
  if (K > 64 || N > 64) throw std::logic_error("linear: no skinny kernel for features past 64");
  using k32 = std::integral_constant<int, 32>;
  using k64 = std::integral_constant<int, 64>;
  if (K <= 32 && N <= 32)
    fn(k32{}, k32{});
  else if (K <= 32)
    fn(k32{}, k64{});
  else if (N <= 32)
    fn(k64{}, k32{});
  else
    fn(k64{}, k64{});
}

// The persistent grid: one block per tile, at most as many as are resident at once.
template <class Kernel>
int persistent_grid(Kernel kernel, size_t shared_bytes, int tiles) {
  FUSEKIT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
  return std::max(1, std::min(tiles, resident_blocks(kernel, kThreads, shared_bytes)));
}

void check_skinny(const LinearShape& shape) {
  // Tile counts are ceil_div(rows, 256) in int: rows within a tile of INT_MAX would overflow it.
  if (shape.rows > std::numeric_limits<int>::max() - kForwardTileRows16) {
    throw std::invalid_argument("linear: the skinny kernels take at most " +
                                std::to_string(std::numeric_limits<int>::max() - kForwardTileRows16) + " rows (got " +
                                std::to_string(shape.rows) + ")");
  }
  if (shape.padded || shape.out_features > kSkinnyMaxFeatures || shape.in_features > kSkinnyMaxFeatures) {
    throw std::invalid_argument("linear: the skinny kernels take unpadded shapes with features <= 64 (got " +
                                std::to_string(shape.rows) + "x" + std::to_string(shape.out_features) + "x" +
                                std::to_string(shape.in_features) + ")");
  }
}

template <class T>
void forward_typed(const LinearShape& s, const void* x, const void* weight, const void* bias, void* y,
                   cudaStream_t stream) {
  const int M = s.rows, N = s.out_features, K = s.in_features;
  const bool vector_x = aligned16(x), vector_y = aligned16(y);
  if constexpr (std::is_same_v<T, float>) {
    const int R = kTileRows32, NG = ceil_div(N, 4);
    const size_t bytes = (static_cast<size_t>(K) * NG + NG) * 16 +
                         (2 * stage_elements<float>(R * K) + stage_elements<float>(R * N)) * sizeof(float);
    const int grid = persistent_grid(skinny_forward_fma_kernel, bytes, ceil_div(M, R));
    skinny_forward_fma_kernel<<<grid, kThreads, bytes, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(weight), static_cast<const float*>(bias),
        static_cast<float*>(y), M, N, K, R, vector_x, vector_y);
  } else {
    dispatch_padded_sizes(K, N, [&](auto kp, auto np) {
      constexpr int KP = decltype(kp)::value, NP = decltype(np)::value;
      const int R = kForwardTileRows16;
      const size_t bytes = static_cast<size_t>(KP / 16) * (NP / 8) * kWarpSize * sizeof(uint2) +
                           (2 * stage_elements<T>(R * K) + stage_elements<T>(R * N)) * sizeof(T);
      auto kernel = skinny_forward_mma_kernel<T, KP, NP>;
      const int grid = persistent_grid(kernel, bytes, ceil_div(M, R));
      kernel<<<grid, kThreads, bytes, stream>>>(static_cast<const T*>(x), static_cast<const T*>(weight),
                                                static_cast<const T*>(bias), static_cast<T*>(y), M, N, K, R, vector_x,
                                                vector_y);
    });
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(LinearContext& context, const LinearShape& s, const void* dy, const void* x, const void* weight,
                    void* dx, void* dweight, void* dbias, cudaStream_t stream) {
  const int M = s.rows, N = s.out_features, K = s.in_features;
  const bool vector_dy = aligned16(dy), vector_x = aligned16(x), vector_dx = aligned16(dx);
  // The partials: [blocks][N * K] for dW, then [blocks][N] for db.
  auto partials = [&](int blocks) {
    return static_cast<float*>(
        context.scratch(2, static_cast<size_t>(blocks) * (static_cast<size_t>(N) * K + N) * sizeof(float), stream));
  };
  int grid = 0;
  float* partial = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    const int R = kTileRows32, KG = ceil_div(K, 4);
    const size_t bytes =
        static_cast<size_t>(N) * KG * 16 +
        (2 * stage_elements<float>(R * N) + 2 * stage_elements<float>(R * K) + stage_elements<float>(R * K)) *
            sizeof(float);
    grid = persistent_grid(skinny_backward_fma_kernel, bytes, ceil_div(M, R));
    partial = partials(grid);
    skinny_backward_fma_kernel<<<grid, kThreads, bytes, stream>>>(
        static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(weight),
        static_cast<float*>(dx), partial, dbias ? partial + static_cast<size_t>(grid) * N * K : nullptr, M, N, K, R,
        vector_dy, vector_x, vector_dx);
  } else {
    dispatch_padded_sizes(K, N, [&](auto kp, auto np) {
      constexpr int KP = decltype(kp)::value, NP = decltype(np)::value;
      const int R = kBackwardTileRows16;
      const size_t bytes = static_cast<size_t>(NP / 16) * (KP / 8) * kWarpSize * sizeof(uint2) +
                           (2 * stage_elements<T>(R * N) + 3 * stage_elements<T>(R * K)) * sizeof(T);
      auto kernel = skinny_backward_mma_kernel<T, KP, NP>;
      grid = persistent_grid(kernel, bytes, ceil_div(M, R));
      partial = partials(grid);
      kernel<<<grid, kThreads, bytes, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                static_cast<const T*>(weight), static_cast<T*>(dx), partial,
                                                dbias ? partial + static_cast<size_t>(grid) * N * K : nullptr, M, N, K,
                                                R, vector_dy, vector_x, vector_dx);
    });
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  using layernorm_rows::launch_parameter_gradients;
  using layernorm_rows::ParameterGradients;
  launch_parameter_gradients<T, 1>(partial, grid, N * K, ParameterGradients<T, 1>{{static_cast<T*>(dweight)}}, stream);
  if (dbias) {
    launch_parameter_gradients<T, 1>(partial + static_cast<size_t>(grid) * N * K, grid, N,
                                     ParameterGradients<T, 1>{{static_cast<T*>(dbias)}}, stream);
  }
}

}  // namespace

void skinny_linear_forward(DType dtype, const LinearShape& shape, const void* x, const void* weight, const void* bias,
                           void* y, cudaStream_t stream) {
  check_skinny(shape);
  dispatch_dtype(dtype, "linear", [&](auto type) {
    using T = typename decltype(type)::type;
    forward_typed<T>(shape, x, weight, bias, y, stream);
  });
}

void skinny_linear_backward(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                            const void* x, const void* weight, void* dx, void* dweight, void* dbias,
                            cudaStream_t stream) {
  check_skinny(shape);
  dispatch_dtype(dtype, "linear", [&](auto type) {
    using T = typename decltype(type)::type;
    backward_typed<T>(context, shape, dy, x, weight, dx, dweight, dbias, stream);
  });
}

}  // namespace fusekit::kernels
