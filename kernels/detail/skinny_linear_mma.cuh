// The skinny linear kernels for fp16 and bf16: forward and backward on mma.sync, the operands
// gathered into fragments from shared-memory tiles.
#pragma once

#include "kernels/detail/layernorm_common.cuh"
#include "kernels/detail/skinny_linear_common.cuh"

namespace fusekit::kernels {
// Included by skinny_linear.cu alone: its kernels keep the anonymous namespace (and so their names
// in traces) of the one translation unit that launches them.
namespace {

// y = x W^T + b, fp16/bf16. Warp w computes the m-tiles w, w + 8, ... (16 rows each) of every tile
// its block visits, all N_pad columns: acc[j] is columns 8j .. 8j + 7.
template <class T, int KP, int NP>
__global__ void __launch_bounds__(kThreads, 2)
    skinny_forward_mma_kernel(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                              T* __restrict__ y, int M, int N, int K, int tile_rows, bool vector_x, bool vector_y) {
  constexpr int KT = KP / 16, NT = NP / 8;
  extern __shared__ uint4 shared[];
  uint2* w_fragments = reinterpret_cast<uint2*>(shared);  // [KT][NT][lane]: the B fragments of W^T
  T* x_stages = reinterpret_cast<T*>(w_fragments + KT * NT * kWarpSize);
  const int x_elements = stage_elements<T>(tile_rows * K);
  T* y_stage = x_stages + 2 * x_elements;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, g = lane / 4, t = lane % 4;
  const uint16_t* w16 = reinterpret_cast<const uint16_t*>(weight);
  for (int i = threadIdx.x; i < KT * NT * kWarpSize; i += blockDim.x) {
    const int l = i % kWarpSize, kt = i / kWarpSize / NT, j = i / kWarpSize % NT;
    const int n = j * 8 + l / 4, k = kt * 16 + 2 * (l % 4);  // B[k][n] = W[n][k]
    auto w = [&](int kk) { return element_bits(w16, n * K + kk, n < N && kk < K); };
    w_fragments[i] = make_uint2(w(k) | w(k + 1) << 16, w(k + 8) | w(k + 9) << 16);
  }
  float bias_pair[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = j * 8 + 2 * t;
    bias_pair[j][0] = n < N ? to_float(bias[n]) : 0.f;
    bias_pair[j][1] = n + 1 < N ? to_float(bias[n + 1]) : 0.f;
  }

  walk_tiles(
      M, tile_rows,
      [&](size_t row0, int rows, int stage) {
        load_range_async(x_stages + stage * x_elements, x + row0 * K, rows * K, vector_x);
      },
      [&](int tile, int stage, int rows) {
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(x_stages + stage * x_elements);
        for (int m0 = warp * 16; m0 < rows; m0 += kWarps * 16) {
          const int r0 = m0 + g, r1 = r0 + 8;
          float acc[NT][4] = {};
          rows_times_fragments<T, KT, NT>(acc, xs, K, r0, r1, t, w_fragments, lane);
          // Rows past the tile's end are computed from stale shared memory and never leave the stage.
          stage_fragment_rows<T, NT, true>(y_stage, N, r0, r1, t, acc, bias_pair);
        }
        __syncthreads();  // y_stage complete; also: every warp is done with this x stage
        store_range(y + static_cast<size_t>(tile) * tile_rows * N, y_stage, rows * N, vector_y);
      });
}

// dx = dy W, dW and db partials, fp16/bf16. dx as the forward (A = dy, k over N). dW [N_pad, K_pad]
// is NS x KJ mma tiles of 16 x 8; warp w owns m-tile w % NS and n-tiles w / NS + i * (8 / NS), and
// runs the k loop of its tiles over the rows of each tile: A = dy^T, B = x. The warps that own n-tile
// 0 also multiply their A by ones: db.
template <class T, int KP, int NP>
__global__ void __launch_bounds__(kThreads, 2)
    skinny_backward_mma_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                               T* __restrict__ dx, float* __restrict__ dweight_partial,
                               float* __restrict__ dbias_partial, int M, int N, int K, int tile_rows, bool vector_dy,
                               bool vector_x, bool vector_dx) {
  constexpr int NS = NP / 16, KJ = KP / 8;
  constexpr int kStride = kWarps / NS, kOwned = NS * KJ / kWarps;
  static_assert(NS * KJ % kWarps == 0 && kWarps % NS == 0, "dW tiles must split evenly over the warps");
  extern __shared__ uint4 shared[];
  uint2* w_fragments = reinterpret_cast<uint2*>(shared);  // [NS][KJ][lane]: the B fragments of W
  T* dy_stages = reinterpret_cast<T*>(w_fragments + NS * KJ * kWarpSize);
  const int dy_elements = stage_elements<T>(tile_rows * N), x_elements = stage_elements<T>(tile_rows * K);
  T* x_stages = dy_stages + 2 * dy_elements;
  T* dx_stage = x_stages + 2 * x_elements;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, g = lane / 4, t = lane % 4;
  const uint16_t* w16 = reinterpret_cast<const uint16_t*>(weight);
  for (int i = threadIdx.x; i < NS * KJ * kWarpSize; i += blockDim.x) {
    const int l = i % kWarpSize, ns = i / kWarpSize / KJ, j = i / kWarpSize % KJ;
    const int n = ns * 16 + 2 * (l % 4), k = j * 8 + l / 4;  // B[n][k] = W[n][k]
    auto w = [&](int nn) { return element_bits(w16, nn * K + k, nn < N && k < K); };
    w_fragments[i] = make_uint2(w(n) | w(n + 1) << 16, w(n + 8) | w(n + 9) << 16);
  }
  const int own_m = warp % NS, own_j = warp / NS;
  const int n0 = own_m * 16 + g, n1 = n0 + 8;  // the rows of dW (and db) in this lane's fragments
  const uint32_t ones = pack_pair<T>(1.f, 1.f);
  float dw_acc[kOwned][4] = {};
  float db_acc[4] = {};

  walk_tiles(
      M, tile_rows,
      [&](size_t row0, int rows, int stage) {
        load_range_async(dy_stages + stage * dy_elements, dy + row0 * N, rows * N, vector_dy);
        load_range_async(x_stages + stage * x_elements, x + row0 * K, rows * K, vector_x);
      },
      [&](int tile, int stage, int rows) {
        const uint16_t* dys = reinterpret_cast<const uint16_t*>(dy_stages + stage * dy_elements);
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(x_stages + stage * x_elements);

        if (dx != nullptr) {
          for (int m0 = warp * 16; m0 < rows; m0 += kWarps * 16) {
            const int r0 = m0 + g, r1 = r0 + 8;
            float acc[KJ][4] = {};
            rows_times_fragments<T, NS, KJ>(acc, dys, N, r0, r1, t, w_fragments, lane);
            const float none[KJ][2] = {};
            stage_fragment_rows<T, KJ, false>(dx_stage, K, r0, r1, t, acc, none);
          }
        }

        // dW += dy^T x over the tile's rows, 16 at a time; rows past the tile's end are zero.
        for (int r = 0; r < rows; r += 16) {
          const int ra = r + 2 * t, rb = ra + 8;
          const bool a0 = ra < rows, a1 = ra + 1 < rows, b0 = rb < rows, b1 = rb + 1 < rows;
          const uint32_t a[4] = {gather_pair(dys, ra * N + n0, a0 && n0 < N, (ra + 1) * N + n0, a1 && n0 < N),
                                 gather_pair(dys, ra * N + n1, a0 && n1 < N, (ra + 1) * N + n1, a1 && n1 < N),
                                 gather_pair(dys, rb * N + n0, b0 && n0 < N, (rb + 1) * N + n0, b1 && n0 < N),
                                 gather_pair(dys, rb * N + n1, b0 && n1 < N, (rb + 1) * N + n1, b1 && n1 < N)};
#pragma unroll
          for (int i = 0; i < kOwned; ++i) {
            const int k = (own_j + i * kStride) * 8 + g;
            const bool in = k < K;
            const uint32_t x0 = gather_pair(xs, ra * K + k, a0 && in, (ra + 1) * K + k, a1 && in);
            const uint32_t x1 = gather_pair(xs, rb * K + k, b0 && in, (rb + 1) * K + k, b1 && in);
            mma_16816<T>(dw_acc[i], a, x0, x1);
          }
          if (own_j == 0) mma_16816<T>(db_acc, a, ones, ones);  // warp-uniform
        }
        __syncthreads();  // dx_stage complete; every warp done with this stage of dy and x
        if (dx != nullptr) store_range(dx + static_cast<size_t>(tile) * tile_rows * K, dx_stage, rows * K, vector_dx);
      });

  // This block's partial sums: C fragment rows n0, n1, columns k, k + 1.
  float* partial = dweight_partial + static_cast<size_t>(blockIdx.x) * N * K;
#pragma unroll
  for (int i = 0; i < kOwned; ++i) {
    const int k = (own_j + i * kStride) * 8 + 2 * t;
    if (n0 < N && k < K) partial[n0 * K + k] = dw_acc[i][0];
    if (n0 < N && k + 1 < K) partial[n0 * K + k + 1] = dw_acc[i][1];
    if (n1 < N && k < K) partial[n1 * K + k] = dw_acc[i][2];
    if (n1 < N && k + 1 < K) partial[n1 * K + k + 1] = dw_acc[i][3];
  }
  if (dbias_partial != nullptr && own_j == 0 && t == 0) {
    float* bias_partial = dbias_partial + static_cast<size_t>(blockIdx.x) * N;
    if (n0 < N) bias_partial[n0] = db_acc[0];
    if (n1 < N) bias_partial[n1] = db_acc[2];
  }
}

}  // namespace
}  // namespace fusekit::kernels
