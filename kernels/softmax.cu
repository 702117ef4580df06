// Scale, mask and softmax forward and backward (see softmax.h for the math and layouts): the
// launchers. The kernels live under kernels/detail/ (softmax_forward.cuh, softmax_backward.cuh,
// softmax_common.cuh).
//
// Design: the row lives in registers, as in LayerNorm. A row group of TPR threads owns one row at a
// time, each thread holding NV vectors of VEC elements (16 bytes where the key count and pointers
// allow, else single elements): 4..32 lanes of a warp per row for rows up to 1024 elements of 16-bit
// types (odd rows such as Swin's 49 keys take 8 lanes of 8 elements, so a warp works on 4 rows at
// once), a block of 128..1024 threads per row beyond. Rows too long for registers take a looping
// kernel that reads the row twice (correct for any length, slower).
//
// Rows of up to 256 keys that are no multiple of a 16-byte vector (Swin's 49 keys) are read element
// by element in the forward, 8 lanes a row of 49; that kernel is bound by issuing instructions, so
// the row's (b, h, q) comes from multiply-high divisions (fast_divide.h) and Swin's 49 keys get the
// count compiled in. Staging x through shared memory, forming the scores in float in a shared tile,
// and realigning 16-byte vectors with shuffles all add instructions and measured slower. Their
// backward, with no bias to read, stages y and dy in shared-memory tiles, so that global memory sees
// only 16-byte vectors.
//
// The masks become, per row, a key limit (padding, causal: keys at or past it are removed) and
// pointers to the row's additive terms (bias). Removed keys are not read at all, so a padded or
// causal forward reads only the scores it keeps. The lane kernels compile the mask kind in, form the
// scores in base 2 (z * log2(e)), and take each exponential as one subtraction and one
// ex2.approx.ftz, which halves the kernel's instructions where it is bound by issuing them.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/fast_divide.h"
#include "kernels/detail/softmax_backward.cuh"
#include "kernels/detail/softmax_common.cuh"
#include "kernels/detail/softmax_forward.cuh"
#include "kernels/softmax.h"

namespace fusekit::kernels {
namespace {

// ---- kernel launchers

// A register configuration: TPR threads per row, NV vectors per thread.
struct Config {
  int tpr;
  int nv;
};

// The configuration that holds a row of `vectors` vectors of `vec` elements with few idle lanes:
// one 16-byte vector a lane where that fills 4..32 lanes exactly, else 4..32 lanes per row with up
// to 4 vectors each (8 single elements each where vec is 1), else a block per row with 4 vectors
// per thread, or 8 where max_block_nv allows; {0, 0} if none does. One vector a lane holds fewer
// registers, so more rows are in flight. Rows that a padding or causal mask cuts short (`cut_rows`,
// forward) are read in part, so there a row of exactly 2 x 16 or 2 x 32 vectors takes two vectors a
// lane on half the lanes: each shuffle of the reductions then serves twice the elements (measured
// faster at 256 and 512 keys; not at 128, nor for rows read whole).
Config choose_config(int vectors, int vec, int max_block_nv, bool cut_rows = false) {
  if (cut_rows && vec > 1) {
    for (int tpr : {16, 32}) {
      if (vectors == 2 * tpr) return {tpr, 2};
    }
  }
  for (int tpr : {4, 8, 16, 32}) {
    if (vec > 1 && vectors == tpr) return {tpr, 1};
  }
  const int lane_nv = vec == 1 ? 8 : 4;
  for (int tpr : {4, 8, 16, 32}) {
    if (vectors <= tpr * lane_nv) {
      const int nv = ceil_div(vectors, tpr);
      return {tpr, nv > 4 ? 8 : nv};
    }
  }
  for (int tpr : {128, 256, 512, 1024}) {
    if (vectors <= tpr * 4) return {tpr, 4};
  }
  if (max_block_nv >= 8 && vectors <= 1024 * 8) return {1024, 8};
  return {0, 0};
}

// Maps the configuration to the kernel template; FN is called with the compile-time TPR and NV.
template <class FN>
bool dispatch_config(Config config, FN&& fn) {
#define FUSEKIT_SOFTMAX_CASE(TPR_, NV_)                                          \
  if (config.tpr == TPR_ && config.nv == NV_) {                                  \
    fn(std::integral_constant<int, TPR_>{}, std::integral_constant<int, NV_>{}); \
    return true;                                                                 \
  }
#define FUSEKIT_SOFTMAX_LANES(TPR_) \
  FUSEKIT_SOFTMAX_CASE(TPR_, 1)     \
  FUSEKIT_SOFTMAX_CASE(TPR_, 2)     \
  FUSEKIT_SOFTMAX_CASE(TPR_, 3) FUSEKIT_SOFTMAX_CASE(TPR_, 4) FUSEKIT_SOFTMAX_CASE(TPR_, 8)
  FUSEKIT_SOFTMAX_LANES(4)
  FUSEKIT_SOFTMAX_LANES(8)
  FUSEKIT_SOFTMAX_LANES(16)
  FUSEKIT_SOFTMAX_LANES(32)
  FUSEKIT_SOFTMAX_CASE(128, 4)
  FUSEKIT_SOFTMAX_CASE(256, 4)
  FUSEKIT_SOFTMAX_CASE(512, 4)
  FUSEKIT_SOFTMAX_CASE(1024, 4)
  FUSEKIT_SOFTMAX_CASE(1024, 8)
#undef FUSEKIT_SOFTMAX_LANES
#undef FUSEKIT_SOFTMAX_CASE
  return false;
}

// Whether a configuration exists as a kernel: 8 vectors per thread only where the registers hold
// them (the forward keeps NV * VEC floats, the backward 2 * NV vectors of the storage type), and
// for lanes per row only with single elements, as choose_config picks it.
template <int VEC, int NV, int TPR>
constexpr bool instantiated(bool backward) {
  if constexpr (NV != 8) return true;
  if (TPR <= kWarpSize) return VEC == 1;
  return backward ? VEC == 1 : VEC * NV <= 32;
}

// Grid size: enough row groups for every row, at most 64 blocks per multiprocessor (the kernels
// loop over rows).
int grid_blocks(int rows, int rows_per_block) {
  return std::max(1, std::min(ceil_div(rows, rows_per_block), 64 * multiprocessors()));
}

// Rows of a staged tile for row groups of `tpr` lanes: whole passes of the block's row groups, as
// many as fit in kStageBytes (at least one: a pass holds at most 256 x 8 elements of <= 4 bytes).
int staged_tile_rows(int tpr, int keys, size_t element_bytes) {
  const int rows_per_pass = kLaneKernelThreads / tpr;
  const size_t pass_bytes = static_cast<size_t>(rows_per_pass) * keys * element_bytes;
  return rows_per_pass * std::max<int>(1, static_cast<int>(kStageBytes / pass_bytes));
}

template <class T>
void forward_typed(const T* x, T* y, const Masking<T>& masking, float scale, int rows, cudaStream_t stream) {
  const int keys = masking.keys;
  const int vec = vector_width<T>(keys, {x, y, masking.bias, masking.window_mask});
  const int max_block_nv = 32 / vec >= 8 ? 8 : 4;
  const bool cut_rows = masking.kind == SoftmaxMask::padding || masking.kind == SoftmaxMask::causal;
  const Config config = choose_config(keys / vec, vec, max_block_nv, cut_rows);
  if (vec == 1 && keys == 49 && masking.kind == SoftmaxMask::bias) {
    // Swin's window 7: 8 lanes a row, 7 elements each, the key count compiled in.
    softmax_forward_kernel<T, 1, 7, 8, SoftmaxMask::bias, 49>
        <<<grid_blocks(rows, kLaneKernelThreads / 8), kLaneKernelThreads, 0, stream>>>(x, y, masking, scale, rows);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto launch = [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (instantiated<VEC, NV, TPR>(false)) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const dim3 grid(grid_blocks(rows, threads / TPR));
        switch (masking.kind) {
          case SoftmaxMask::padding:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::padding>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
            break;
          case SoftmaxMask::causal:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::causal>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
            break;
          case SoftmaxMask::bias:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::bias>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
            break;
          default:
            softmax_forward_kernel<T, VEC, NV, TPR, SoftmaxMask::none>
                <<<grid, threads, 0, stream>>>(x, y, masking, scale, rows);
        }
      } else {
        throw std::logic_error("softmax: no forward kernel for the chosen configuration");
      }
    });
    if (!done) {
      softmax_forward_looping_kernel<T><<<grid_blocks(rows, 1), 1024, 0, stream>>>(x, y, masking, scale, rows);
    }
  };
  if (vec == 1)
    launch(std::integral_constant<int, 1>{});
  else
    launch(std::integral_constant<int, 16 / sizeof(T)>{});
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(const T* y, const T* dy, T* dx, float scale, int rows, int keys, cudaStream_t stream) {
  const int vec = vector_width<T>(keys, {y, dy, dx});
  const Config config = choose_config(keys / vec, vec, vec == 1 ? 8 : 4);
  if (vec == 1 && config.tpr > 0 && config.tpr <= kWarpSize && aligned16(y) && aligned16(dy) && aligned16(dx)) {
    const int tile_rows = staged_tile_rows(config.tpr, keys, sizeof(T));
    const size_t shared = 2 * static_cast<size_t>(tile_rows) * keys * sizeof(T);
    dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (TPR <= kWarpSize) {
        launch_after_prior(softmax_backward_staged_kernel<T, NV, TPR>, dim3(grid_blocks(rows, tile_rows)),
                           dim3(kLaneKernelThreads), shared, stream, y, dy, dx, scale, rows, keys, tile_rows);
      }
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto launch = [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (instantiated<VEC, NV, TPR>(true)) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        launch_after_prior(softmax_backward_kernel<T, VEC, NV, TPR>, dim3(grid_blocks(rows, threads / TPR)),
                           dim3(threads), 0, stream, y, dy, dx, scale, rows, keys);
      } else {
        throw std::logic_error("softmax: no backward kernel for the chosen configuration");
      }
    });
    if (!done) {
      softmax_backward_looping_kernel<T><<<grid_blocks(rows, 1), 1024, 0, stream>>>(y, dy, dx, scale, rows, keys);
    }
  };
  if (vec == 1)
    launch(std::integral_constant<int, 1>{});
  else
    launch(std::integral_constant<int, 16 / sizeof(T)>{});
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

// Rows of the problem; throws std::invalid_argument for sizes it cannot take.
int checked_rows(SoftmaxShape s) {
  if (s.batch < 0 || s.heads <= 0 || s.queries <= 0 || s.keys <= 0) {
    throw std::invalid_argument("softmax: batch must be >= 0 and heads, queries, keys > 0 (got " +
                                std::to_string(s.batch) + "x" + std::to_string(s.heads) + "x" +
                                std::to_string(s.queries) + "x" + std::to_string(s.keys) + ")");
  }
  const long long rows = static_cast<long long>(s.batch) * s.heads * s.queries;
  if (rows > INT_MAX) {
    throw std::invalid_argument("softmax: batch x heads x queries must be at most " + std::to_string(INT_MAX) +
                                " rows (got " + std::to_string(rows) + ")");
  }
  return static_cast<int>(rows);
}

void check_masking(const SoftmaxMasking& m) {
  if (m.kind == SoftmaxMask::padding && !m.lengths) {
    throw std::invalid_argument("softmax: the padding mask needs lengths");
  }
  if (m.kind == SoftmaxMask::bias && !m.bias) throw std::invalid_argument("softmax: the bias mask needs a bias");
  if (m.kind == SoftmaxMask::bias && m.window_mask && m.windows <= 0) {
    throw std::invalid_argument("softmax: a window mask needs windows >= 1 (got " + std::to_string(m.windows) + ")");
  }
}

}  // namespace

void softmax_forward(DType dtype, const void* x, void* y, SoftmaxShape shape, float scale,
                     const SoftmaxMasking& masking, cudaStream_t stream) {
  const int rows = checked_rows(shape);
  check_masking(masking);
  if (rows == 0) return;
  dispatch_dtype(dtype, "softmax", [&](auto type) {
    using T = typename decltype(type)::type;
    const bool bias = masking.kind == SoftmaxMask::bias;
    const Masking<T> m{masking.kind,
                       masking.lengths,
                       bias ? static_cast<const T*>(masking.bias) : nullptr,
                       bias ? static_cast<const T*>(masking.window_mask) : nullptr,
                       FastDivide(std::max(masking.windows, 1)),
                       FastDivide(shape.heads),
                       FastDivide(shape.queries),
                       shape.keys};
    forward_typed<T>(static_cast<const T*>(x), static_cast<T*>(y), m, scale, rows, stream);
  });
}

void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, SoftmaxShape shape, float scale,
                      cudaStream_t stream) {
  const int rows = checked_rows(shape);
  if (rows == 0) return;
  dispatch_dtype(dtype, "softmax", [&](auto type) {
    using T = typename decltype(type)::type;
    backward_typed<T>(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), scale, rows, shape.keys,
                      stream);
  });
}

}  // namespace fusekit::kernels
