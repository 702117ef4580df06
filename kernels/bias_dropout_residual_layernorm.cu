// Bias + dropout + residual + LayerNorm forward and backward (see bias_dropout_residual_layernorm.h
// for the math, the two orders and the layouts): the launchers. The kernels live under
// kernels/detail/ (bias_dropout_residual_layernorm_forward.cuh, _backward.cuh, _common.cuh).
//
// Design: LayerNorm's kernels (layernorm.cu) with the epilogue folded into their loads. The row lives
// in registers in the configurations of layernorm_common.cuh; a thread draws the dropout words of its
// own vectors (one Philox call per 8 elements), so the mask costs arithmetic, never memory. h is
// formed in float with rounded operations (no FMA contraction), so the backward's recomputation of
// h in post-LN is bit for bit the forward's. The backward keeps each thread's columns fixed across
// its rows, so dgamma, dbeta and dbias accumulate in registers (a warp per row: in shared memory, see
// ColumnSums); each block writes one partial row of each and a second kernel sums the partials. No atomics.
// Rows too long for the register configurations (forward: 4096 vectors; backward: 1024, i.e. 8192 16-bit or 4096 float
// columns) take looping kernels that recompute h per pass (correct for any length, slower).
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/detail/bias_dropout_residual_layernorm_backward.cuh"
#include "kernels/detail/bias_dropout_residual_layernorm_common.cuh"
#include "kernels/detail/bias_dropout_residual_layernorm_forward.cuh"
#include "kernels/detail/dispatch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
namespace {

// ---- kernel launchers

// The backward holds four floats per element (h and three parameter-gradient accumulators): with
// more than 256 threads a block (at most 128 registers each) they would spill, so longer rows take
// the looping kernel.
constexpr int kBackwardMaxThreadsPerRow = 256;

template <class T>
void forward_typed(const ForwardArgs<T>& a, cudaStream_t stream) {
  const int vec = vector_width<T>(a.C, {a.x, a.bias, a.residual, a.gamma, a.beta, a.h, a.y});
  Config config = choose_row_config(a.C / vec, 1024, vec);
  // Rows of 97..128 vectors (1024 16-bit columns): a block of 64 threads a row, two vectors each,
  // not a warp of four, which measured slower. At 768 columns (96 vectors) a warp per row stays
  // faster.
  const bool pair_rows = vec > 1 && a.C / vec > 3 * kWarpSize && a.C / vec <= 4 * kWarpSize;
  if (pair_rows) config = {2 * kWarpSize, 2};
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    auto launch = [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (kRowConfigBuilt<VEC, NV>) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const int rows_per_block = threads / TPR;
        const int blocks = std::min(ceil_div(a.rows, rows_per_block), 64 * multiprocessors());
        bias_dropout_residual_layernorm_forward_kernel<T, VEC, NV, TPR><<<blocks, threads, 0, stream>>>(a);
      }
    };
    bool done = true;
    if (pair_rows)
      launch(std::integral_constant<int, 2 * kWarpSize>{}, std::integral_constant<int, 2>{});
    else
      done = dispatch_config(config, launch);
    if (!done) {
      const int blocks = std::min(a.rows, 64 * multiprocessors());
      bias_dropout_residual_layernorm_forward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(a);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(BackwardArgs<T> a, T* dgamma, T* dbeta, T* dbias, cudaStream_t stream) {
  const int vec = vector_width<T>(a.C, {a.dy, a.dh_extra, a.h, a.x, a.bias, a.residual, a.gamma, a.dx, a.dresidual});
  Config config = choose_row_config(a.C / vec, kBackwardMaxThreadsPerRow, vec);
  if (vec > 1 && config.tpr > 0 && config.tpr <= kWarpSize) config = choose_backward_config(a.C / vec);
  // Rows of 33..96 vectors: a block per row, one vector a thread, the sums in registers
  // (block_row_config), which measured faster than a warp per row with its sums in shared memory. At
  // 1024 columns one row a block was no faster or slower; rows of 128 vectors take two rows a block
  // instead (bias_dropout_residual_layernorm_backward_rows_kernel), other rows of 97 vectors and more
  // keep the warp.
  const bool block_rows = vec > 1 && a.C / vec > kWarpSize && a.C / vec <= 3 * kWarpSize;
  if (block_rows) config = block_row_config(a.C / vec);
  const int limit = backward_block_limit(a.rows);
  int blocks = limit;
  constexpr int kRowsTPB = 128, kRowsAtOnce = 2;
  if (vec > 1 && a.C / vec == kRowsTPB) {
    // Rows of 128 vectors (1024 16-bit columns): bias_dropout_residual_layernorm_backward_rows_kernel.
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      if constexpr (VEC > 1) {
        auto kernel = bias_dropout_residual_layernorm_backward_rows_kernel<T, VEC, kRowsTPB, kRowsAtOnce>;
        blocks = std::max(
            1, std::min({limit, resident_blocks(kernel, kRowsTPB), ceil_div(std::max(a.rows, 1), kRowsAtOnce)}));
        launch_after_prior(kernel, dim3(blocks), dim3(kRowsTPB), 0, stream, a);
      }
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    launch_parameter_gradients<T, 3>(a.partial, blocks, a.C, {{dgamma, dbeta, dbias}}, stream);
    return;
  }
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    auto launch = [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (TPR <= kBackwardMaxThreadsPerRow && kRowConfigBuilt<VEC, NV>) {
        const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
        const size_t shared = TPR <= kWarpSize ? sizeof(float) * 3 * a.C * (threads / kWarpSize) : 0;
        auto kernel = bias_dropout_residual_layernorm_backward_kernel<T, VEC, NV, TPR>;
        if (shared > 48 * 1024) {
          FUSEKIT_CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        }
        // As many blocks as fit on the GPU at once (one wave: each block's partial row is written
        // once, after all its rows), within the limit the workspace was sized for.
        const int rows_per_block = threads / TPR;
        blocks = std::max(1, std::min({limit, resident_blocks(kernel, threads, shared),
                                       ceil_div(std::max(a.rows, 1), rows_per_block)}));
        launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, a);
      }
    };
    const bool done = dispatch_block_row_config(config, launch) || dispatch_config(config, launch);
    if (!done) bias_dropout_residual_layernorm_backward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(a);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  launch_parameter_gradients<T, 3>(a.partial, blocks, a.C, {{dgamma, dbeta, dbias}}, stream);
}

void check_sizes(int rows, int C) {
  if (rows < 0 || C <= 0) {
    throw std::invalid_argument("bias_dropout_residual_layernorm: rows must be >= 0 and columns > 0 (got " +
                                std::to_string(rows) + " x " + std::to_string(C) + ")");
  }
}

void check_dropout(Dropout dropout) {
  if (!(dropout.p >= 0.f && dropout.p < 1.f)) {
    throw std::invalid_argument("bias_dropout_residual_layernorm: dropout probability must be in [0, 1) (got " +
                                std::to_string(dropout.p) + ")");
  }
}

void require(bool present, const char* what) {
  if (!present) throw std::invalid_argument(std::string("bias_dropout_residual_layernorm: ") + what);
}

}  // namespace

void bias_dropout_residual_layernorm_forward(DType dtype, ResidualOrder order,
                                             const BiasDropoutResidualForwardTensors& tensors, Dropout dropout,
                                             int rows, int columns, float eps, cudaStream_t stream) {
  check_sizes(rows, columns);
  check_dropout(dropout);
  const bool pre_ln = order == ResidualOrder::pre_ln;
  require(tensors.x && tensors.bias && tensors.residual && tensors.gamma && tensors.beta && tensors.y && tensors.mean &&
              tensors.rstd,
          "forward needs x, bias, residual, gamma, beta, y, mean and rstd");
  require(!pre_ln || tensors.h, "pre-LN forward writes h: pass it");
  if (rows == 0) return;
  dispatch_dtype(dtype, "bias_dropout_residual_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    const ForwardArgs<T> args{static_cast<const T*>(tensors.x),
                              static_cast<const T*>(tensors.bias),
                              static_cast<const T*>(tensors.residual),
                              static_cast<const T*>(tensors.gamma),
                              static_cast<const T*>(tensors.beta),
                              pre_ln ? static_cast<T*>(tensors.h) : nullptr,
                              static_cast<T*>(tensors.y),
                              tensors.mean,
                              tensors.rstd,
                              rows,
                              columns,
                              eps,
                              pre_ln,
                              dropout_stream(dropout.p, dropout.seed, dropout.offset, dropout.counter)};
    forward_typed<T>(args, stream);
  });
}

size_t bias_dropout_residual_layernorm_backward_workspace_bytes(int rows, int columns) {
  check_sizes(rows, columns);
  return sizeof(float) * 3 * static_cast<size_t>(columns) * backward_block_limit(std::max(rows, 1));
}

void bias_dropout_residual_layernorm_backward(DType dtype, ResidualOrder order,
                                              const BiasDropoutResidualBackwardTensors& tensors, Dropout dropout,
                                              int rows, int columns, void* workspace, cudaStream_t stream) {
  check_sizes(rows, columns);
  check_dropout(dropout);
  const bool pre_ln = order == ResidualOrder::pre_ln;
  require(tensors.dy && tensors.gamma && tensors.mean && tensors.rstd && tensors.dx && tensors.dresidual &&
              tensors.dbias && tensors.dgamma && tensors.dbeta && workspace,
          "backward needs dy, gamma, mean, rstd, dx, dresidual, dbias, dgamma, dbeta and a workspace");
  if (pre_ln) {
    require(tensors.h, "pre-LN backward reads the forward's h: pass it");
  } else {
    require(tensors.x && tensors.bias && tensors.residual, "post-LN backward recomputes h: pass x, bias and residual");
    require(!tensors.dh_extra, "post-LN has no h output, so no dh_extra: pass none");
  }
  dispatch_dtype(dtype, "bias_dropout_residual_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    const BackwardArgs<T> args{static_cast<const T*>(tensors.dy),
                               static_cast<const T*>(tensors.dh_extra),
                               pre_ln ? static_cast<const T*>(tensors.h) : nullptr,
                               pre_ln ? nullptr : static_cast<const T*>(tensors.x),
                               pre_ln ? nullptr : static_cast<const T*>(tensors.bias),
                               pre_ln ? nullptr : static_cast<const T*>(tensors.residual),
                               static_cast<const T*>(tensors.gamma),
                               tensors.mean,
                               tensors.rstd,
                               static_cast<T*>(tensors.dx),
                               static_cast<T*>(tensors.dresidual),
                               static_cast<float*>(workspace),
                               rows,
                               columns,
                               pre_ln,
                               dropout_stream(dropout.p, dropout.seed, dropout.offset, dropout.counter)};
    backward_typed<T>(args, static_cast<T*>(tensors.dgamma), static_cast<T*>(tensors.dbeta),
                      static_cast<T*>(tensors.dbias), stream);
  });
}

void bias_dropout_residual_layernorm_mask(DType dtype, Dropout dropout, void* mask, int rows, int columns,
                                          cudaStream_t stream) {
  check_sizes(rows, columns);
  check_dropout(dropout);
  const size_t count = static_cast<size_t>(rows) * columns;
  if (count == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>((count + 255) / 256, 64 * multiprocessors()));
  dispatch_dtype(dtype, "bias_dropout_residual_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
    dropout_mask_kernel<T><<<blocks, 256, 0, stream>>>(
        static_cast<T*>(mask), count, dropout_stream(dropout.p, dropout.seed, dropout.offset, dropout.counter));
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::kernels
