// Host-side helpers for choosing a launch: the SM count, and the vector width that the sizes and
// the pointers allow.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda_check.h"

namespace fusekit::kernels {

// SMs of the current device (asked once per process).
inline int multiprocessors() {
  static const int count = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return std::max(sms, 1);
  }();
  return count;
}

// Whether `bytes` exceed the current device's L2 cache (its size asked once per process): an output
// that large cannot stay in L2 until it is read, so kernels store it streaming.
inline bool larger_than_l2(size_t bytes) {
  static const size_t l2 = [] {
    int device = 0, size = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&size, cudaDevAttrL2CacheSize, device);
    return static_cast<size_t>(std::max(size, 0));
  }();
  return bytes > l2;
}

// Blocks of `threads` threads and `shared` bytes of dynamic shared memory that fit on the GPU at once.
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, size_t shared = 0) {
  int per_multiprocessor = 0;
  FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, threads, shared));
  return std::max(per_multiprocessor, 1) * multiprocessors();
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Elements of T per 16-byte vector where the row length and every pointer allow it, else 1.
// Null pointers (optional operands) do not count.
template <class T>
int vector_width(long long row_length, std::initializer_list<const void*> pointers) {
  constexpr int kVec = 16 / sizeof(T);
  if (row_length % kVec != 0) return 1;
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return 1;
  }
  return kVec;
}

}  // namespace fusekit::kernels
