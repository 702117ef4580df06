// Register-level tensor-core products (mma.sync, ldmatrix) and asynchronous copies (cp.async): for
// the attention kernels that keep their scores in registers (bert_attention, both window sizes of
// window_attention) and the skinny linear kernels; the bias + dropout + residual + LayerNorm
// backward uses the copies.
//
// mma.sync m16n8k16 with fp32 accumulators (PTX ISA, "Matrix Fragments for mma.m16n8k16"). With
// lane = 4 g + t (g = lane / 4, t = lane % 4) and pairs of 16-bit elements packed in one register,
// the lower address in the low half:
//   A, 16x16 row-major: a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//                       a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   B, 16x8 (k x n):    b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C, 16x8 float:      c[0], c[1] = C[g][2t, 2t+1];  c[2], c[3] = C[g+8][2t, 2t+1]
// Two C tiles side by side (columns 0..7 and 8..15) thus hold, element for element, the A fragment
// of the same 16x16 block: a product's scores become the next product's left operand without
// leaving registers (FlashAttention-2 keeps P this way).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace fusekit::kernels {

// c += A B for one 16x16 by 16x8 step, T = __half or __nv_bfloat16.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `low` in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(low, high);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Two 16-bit elements that are not adjacent in memory, `low` in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack_elements(const T* low, const T* high) {
  const uint16_t l = *reinterpret_cast<const uint16_t*>(low), h = *reinterpret_cast<const uint16_t*>(high);
  return static_cast<uint32_t>(l) | static_cast<uint32_t>(h) << 16;
}

// Two adjacent 16-bit elements (4-byte aligned).
template <class T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// The shared-memory address (state space .shared) of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix: four 8x8 matrices of 16-bit elements from shared memory, lanes 8i .. 8i + 7 giving the
// shared addresses of matrix i's rows 0..7 (16-byte aligned); r[i] receives matrix i. Plain: lane
// 4g + t holds row g, columns 2t, 2t + 1 (an A fragment, or the B fragment of a [n][k]-stored
// matrix). Transposed: it holds rows 2t, 2t + 1 of column g (the B fragment of a [k][n]-stored one).
__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void load_matrix_x4_transposed(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// 16 bytes global -> shared without passing through registers (cp.async.cg: cached in L2 only);
// both addresses 16-byte aligned.
__device__ __forceinline__ void copy_async16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}

// 4 bytes global -> shared (cp.async.ca); both addresses 4-byte aligned.
__device__ __forceinline__ void copy_async4(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(address), "l"(global));
}

// Closes the group of copies this thread issued since the last commit.
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

}  // namespace fusekit::kernels
