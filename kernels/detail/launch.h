// Host-side helpers for choosing a launch: the SM count, the vector width that the sizes and the
// pointers allow, opting a kernel into more than 48 KB of shared memory, and programmatic dependent
// launches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

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

// Whether the current device can start a kernel while the one before it in the stream finishes
// (programmatic dependent launch: compute capability 9.0 and later; asked once per process).
inline bool programmatic_launch_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    return major >= 9;
  }();
  return supported;
}

// Launches `kernel` as a programmatic dependent of the kernel before it in the stream: its blocks
// may be scheduled while that kernel's last blocks retire, which hides most of the launch gap.
// Every block of `kernel` must call wait_for_prior_grid() (common.cuh) before its first global
// memory access, read or write: that waits until the kernel before has finished and its writes are
// visible, so what follows is ordered exactly as after an ordinary launch. The runtime overlaps it
// only with a kernel; after other work (a copy, a memset) it waits as usual, and where the device
// cannot, it is an ordinary launch.
template <class... Params, class... Args>
void launch_after_prior(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                        Args&&... args) {
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = programmatic_launch_supported() ? 1 : 0;
  FUSEKIT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
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
