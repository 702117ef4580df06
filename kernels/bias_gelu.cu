// bias + GELU forward and backward (see bias_gelu.h for the math and layouts).
//
// Design: both directions are one pass over the rows, in 16-byte vectors where C and the pointers
// allow, with z = x + bias held in float (never rounded to the storage type). The backward's dbias
// is summed without atomics: each block keeps its columns' partial sums in registers and writes one
// partial row, and a second kernel adds the partial rows in a fixed order.
#include "kernels/bias_gelu.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"

namespace fusekit::kernels {
namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)
constexpr float kTanhScale = 0.79788456080286536f;   // sqrt(2 / pi)
constexpr float kTanhCubic = 0.044715f;

template <GeluApproximation A>
__device__ __forceinline__ float gelu(float z) {
  if constexpr (A == GeluApproximation::none) {
    return 0.5f * z * (1.f + erff(z * kSqrtHalf));
  } else {
    return 0.5f * z * (1.f + tanhf(kTanhScale * (z + kTanhCubic * z * z * z)));
  }
}

template <GeluApproximation A>
__device__ __forceinline__ float gelu_grad(float z) {
  if constexpr (A == GeluApproximation::none) {
    return 0.5f * (1.f + erff(z * kSqrtHalf)) + z * kInvSqrt2Pi * __expf(-0.5f * z * z);
  } else {
    const float t = tanhf(kTanhScale * (z + kTanhCubic * z * z * z));
    return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * kTanhScale * (1.f + 3.f * kTanhCubic * z * z);
  }
}

// Forward: a grid-stride loop over vectors of VEC elements; a vector never crosses a row (C % VEC
// == 0 when VEC > 1), so one column index serves it. UNROLL vectors per thread are loaded before
// any is used, to keep enough bytes in flight.
template <class T, int VEC, GeluApproximation A>
__global__ void __launch_bounds__(256) bias_gelu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias,
                                                                T* __restrict__ y, long long vectors, int C) {
  const bool small = vectors * VEC <= 0xffffffffLL;
  constexpr int UNROLL = 4;
  using V = Vec<T, VEC>;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long base = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; base < vectors;
       base += stride * UNROLL) {
    V in[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = base + u * stride;
      if (i < vectors) in[u] = V::load_stream(x + i * VEC);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = base + u * stride;
      if (i >= vectors) break;
      // 32-bit arithmetic where the tensor allows it: a 64-bit remainder is a long instruction sequence.
      const int c = small ? static_cast<int>(static_cast<unsigned>(i * VEC) % static_cast<unsigned>(C))
                          : static_cast<int>((i * VEC) % C);
      const V b = V::load(bias + c);
      V out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(gelu<A>(to_float(in[u].v[k]) + to_float(b.v[k])));
      out.store(y + i * VEC);
    }
  }
}

// Backward: a block owns a column tile of 32 lanes x VEC columns and walks rows with its 8 warps,
// blockIdx.y-strided; each thread keeps its columns' dbias partial sums in registers, the warps'
// sums meet in shared memory, and the block writes one row of partial sums to the workspace.
constexpr int kBackwardWarps = 8;

template <class T, int VEC, GeluApproximation A>
__global__ void __launch_bounds__(kWarpSize* kBackwardWarps)
    bias_gelu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                              T* __restrict__ dx, float* __restrict__ partial, int rows, int C) {
  constexpr int UNROLL = 2;
  using V = Vec<T, VEC>;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int c = (blockIdx.x * kWarpSize + lane) * VEC;
  const bool active = c < C;  // VEC > 1: C % VEC == 0, so a vector is inside the row or past it
  float b[VEC], sum[VEC];
  if (active) {
    const V bv = V::load(bias + c);
#pragma unroll
    for (int k = 0; k < VEC; ++k) b[k] = to_float(bv.v[k]);
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) sum[k] = 0.f;
  const int row_stride = gridDim.y * kBackwardWarps;
  if (active) {
    for (int r0 = blockIdx.y * kBackwardWarps + warp; r0 < rows; r0 += row_stride * UNROLL) {
      V g[UNROLL], in[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int r = r0 + u * row_stride;
        if (r < rows) {
          const size_t at = static_cast<size_t>(r) * C + c;
          g[u] = V::load_stream(dy + at);
          in[u] = V::load_stream(x + at);
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int r = r0 + u * row_stride;
        if (r >= rows) break;
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(g[u].v[k]) * gelu_grad<A>(to_float(in[u].v[k]) + b[k]);
          const T stored = from_float<T>(d);
          out.v[k] = stored;
          sum[k] += d;  // dbias sums the unrounded gradient, as a float64 reference would
        }
        out.store(dx + static_cast<size_t>(r) * C + c);
      }
    }
  }
  // Sum the 8 warps' partials per column: [warp][lane * VEC + k], padded against bank conflicts.
  __shared__ float shared[kBackwardWarps][kWarpSize * VEC + 1];
#pragma unroll
  for (int k = 0; k < VEC; ++k) shared[warp][lane * VEC + k] = sum[k];
  __syncthreads();
  for (int j = threadIdx.x; j < kWarpSize * VEC; j += blockDim.x) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kBackwardWarps; ++w) total += shared[w][j];
    const int column = blockIdx.x * kWarpSize * VEC + j;
    if (column < C) partial[static_cast<size_t>(blockIdx.y) * C + column] = total;
  }
}

// dbias[c] = sum over the partial rows; one thread per column, consecutive threads on consecutive
// columns (coalesced), float accumulation over at most a few hundred partials.
template <class T>
__global__ void bias_gelu_dbias_kernel(const float* __restrict__ partial, int partials, int C, T* __restrict__ dbias) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float total = 0.f;
  for (int p = 0; p < partials; ++p) total += partial[static_cast<size_t>(p) * C + c];
  dbias[c] = from_float<T>(total);
}

void check_sizes(int rows, int C) {
  if (rows < 0 || C <= 0) {
    throw std::invalid_argument("bias_gelu: rows must be >= 0 and columns > 0 (got " + std::to_string(rows) + " x " +
                                std::to_string(C) + ")");
  }
}

// Partial-sum rows of the backward: enough blocks for about 4 per SM over all column tiles, and
// no more than there are row groups.
int backward_row_blocks(int rows, int column_tiles) {
  const int wanted = std::max(1, 4 * multiprocessors() / column_tiles);
  return std::max(1, std::min(wanted, ceil_div(rows, kBackwardWarps)));
}

int column_tiles(int C, int vec) { return ceil_div(C, kWarpSize * vec); }

template <class T, GeluApproximation A>
void forward_typed(const T* x, const T* bias, T* y, int rows, int C, cudaStream_t stream) {
  const int vec = vector_width<T>(C, {x, bias, y});
  const long long vectors = static_cast<long long>(rows) * C / vec;
  // One resident wave (8 blocks of 256 threads fill an SM), each thread looping over its vectors.
  const long long wanted = (vectors + 256 * 4 - 1) / (256 * 4);
  const int blocks = static_cast<int>(std::max<long long>(1, std::min<long long>(wanted, 8LL * multiprocessors())));
  if (vec == 1) {
    bias_gelu_forward_kernel<T, 1, A><<<blocks, 256, 0, stream>>>(x, bias, y, vectors, C);
  } else {
    bias_gelu_forward_kernel<T, 16 / sizeof(T), A><<<blocks, 256, 0, stream>>>(x, bias, y, vectors, C);
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T, GeluApproximation A>
void backward_typed(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int rows, int C, float* partial,
                    cudaStream_t stream) {
  const int vec = vector_width<T>(C, {dy, x, bias, dx});
  const int tiles = column_tiles(C, vec);
  const int row_blocks = backward_row_blocks(rows, tiles);
  if (rows > 0) {
    const dim3 grid(tiles, row_blocks);
    if (vec == 1) {
      bias_gelu_backward_kernel<T, 1, A>
          <<<grid, kWarpSize * kBackwardWarps, 0, stream>>>(dy, x, bias, dx, partial, rows, C);
    } else {
      bias_gelu_backward_kernel<T, 16 / sizeof(T), A>
          <<<grid, kWarpSize * kBackwardWarps, 0, stream>>>(dy, x, bias, dx, partial, rows, C);
    }
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  }
  bias_gelu_dbias_kernel<T><<<ceil_div(C, 256), 256, 0, stream>>>(partial, rows > 0 ? row_blocks : 0, C, dbias);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void bias_gelu_forward(DType dtype, GeluApproximation approximation, const void* x, const void* bias, void* y, int rows,
                       int columns, cudaStream_t stream) {
  check_sizes(rows, columns);
  if (rows == 0) return;
  dispatch_dtype(dtype, "bias_gelu", [&](auto type) {
    using T = typename decltype(type)::type;
    if (approximation == GeluApproximation::none) {
      forward_typed<T, GeluApproximation::none>(static_cast<const T*>(x), static_cast<const T*>(bias),
                                                static_cast<T*>(y), rows, columns, stream);
    } else {
      forward_typed<T, GeluApproximation::tanh>(static_cast<const T*>(x), static_cast<const T*>(bias),
                                                static_cast<T*>(y), rows, columns, stream);
    }
  });
}

size_t bias_gelu_backward_workspace_bytes(int rows, int columns) {
  check_sizes(rows, columns);
  // The widest case: one element per lane (the most column tiles, the fewest row blocks).
  const int row_blocks = backward_row_blocks(std::max(rows, 1), 1);
  return sizeof(float) * static_cast<size_t>(columns) * row_blocks;
}

void bias_gelu_backward(DType dtype, GeluApproximation approximation, const void* dy, const void* x, const void* bias,
                        void* dx, void* dbias, int rows, int columns, void* workspace, cudaStream_t stream) {
  check_sizes(rows, columns);
  dispatch_dtype(dtype, "bias_gelu", [&](auto type) {
    using T = typename decltype(type)::type;
    if (approximation == GeluApproximation::none) {
      backward_typed<T, GeluApproximation::none>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx),
          static_cast<T*>(dbias), rows, columns, static_cast<float*>(workspace), stream);
    } else {
      backward_typed<T, GeluApproximation::tanh>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(dx),
          static_cast<T*>(dbias), rows, columns, static_cast<float*>(workspace), stream);
    }
  });
}

}  // namespace fusekit::kernels
