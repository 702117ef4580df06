// Tensor-core tile products for the fused attention kernels (bert_attention.cu; window_attention.cu
// uses only allow_shared): 16x16x16 nvcuda::wmma fragments with fp32 accumulators, every fragment loaded
// from and stored to shared memory (load_matrix_sync / store_matrix_sync only), so nothing depends
// on the fragments' register layout:
//   row_major matrix_a at p, ldm:  A[r][c] = p[r * ldm + c];   col_major: A[r][c] = p[r + c * ldm]
//   (and the same for matrix_b), so a col_major load of a row-major stored X reads X^T.
#pragma once

#include <cuda_runtime.h>
#include <mma.h>

#include <cstddef>

#include "kernels/cuda_check.h"

namespace fusekit::kernels {

using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// acc += sum over `steps` 16-wide steps of A-tile x B-tile; a and b point at the first tiles and
// advance by a_step and b_step elements per step.
template <class T, class LayoutA, class LayoutB>
__device__ __forceinline__ void multiply_add_tiles(Accumulator& acc, const T* a, int lda, int a_step, const T* b,
                                                   int ldb, int b_step, int steps) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
  for (int k = 0; k < steps; ++k) {
    nvcuda::wmma::load_matrix_sync(fa, a + k * a_step, lda);
    nvcuda::wmma::load_matrix_sync(fb, b + k * b_step, ldb);
    nvcuda::wmma::mma_sync(acc, fa, fb, acc);
  }
}

// acc = the same product, from zero.
template <class T, class LayoutA, class LayoutB>
__device__ __forceinline__ void multiply_tiles(Accumulator& acc, const T* a, int lda, int a_step, const T* b, int ldb,
                                               int b_step, int steps) {
  nvcuda::wmma::fill_fragment(acc, 0.f);
  multiply_add_tiles<T, LayoutA, LayoutB>(acc, a, lda, a_step, b, ldb, b_step, steps);
}

// Opts KERNEL into its dynamic shared memory (above the default 48 KB), once per kernel: a template
// on the kernel itself, as instantiations of one kernel template share their function type.
template <auto KERNEL>
void allow_shared(size_t bytes) {
  static const bool done = [bytes] {
    FUSEKIT_CUDA_CHECK(
        cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return true;
  }();
  (void)done;
}

}  // namespace fusekit::kernels
