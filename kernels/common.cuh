// Shared device helpers for fusekit's kernels: 16-byte vectors of the storage type, conversions to
// and from float, warp and block reductions, row groups, and the host-side choices every launcher
// makes (vector width, multiprocessor count).
//
// Storage types are float, __half and __nv_bfloat16; arithmetic is always in float registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda_check.h"
#include "kernels/detail/launch.h"  // host-side launch choices

namespace fusekit::kernels {

constexpr int kWarpSize = 32;

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The first statement of a kernel launched by launch_after_prior (detail/launch.h): waits until the kernel
// before it in the stream has finished and its writes are visible. Returns at once after an ordinary
// launch, and compiles to nothing below sm_90.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N elements of T, loaded and stored as one access of sizeof(T) * N bytes (16 for the fast paths).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ __forceinline__ static Vec load(const T* p) { return *reinterpret_cast<const Vec*>(p); }
  // Streaming load for data read once: do not keep it in L1.
  __device__ __forceinline__ static Vec load_stream(const T* p) {
    Vec out;
    if constexpr (sizeof(Vec) == 16) {
      int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
      out = *reinterpret_cast<Vec*>(&raw);
    } else {
      out = *reinterpret_cast<const Vec*>(p);
    }
    return out;
  }
  // Read-only load (the data does not change during the kernel) that asks L2 to fetch the whole
  // 256-byte block around it: for rows shorter than a block, gathered by row groups whose
  // neighbours read the rest of it at about the same time.
  __device__ __forceinline__ static Vec load_block256(const T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (sizeof(Vec) == 16) {
      uint4 raw;
      asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
          : "l"(p));
      return *reinterpret_cast<const Vec*>(&raw);
    }
#endif
    return *reinterpret_cast<const Vec*>(p);
  }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }
  // Streaming store (evict first) for outputs too large to stay in L2 until they are read.
  __device__ __forceinline__ void store_stream(T* p) const {
    if constexpr (sizeof(Vec) == 16) {
      __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(this));
    } else {
      store(p);
    }
  }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over aligned groups of LANES consecutive lanes (LANES a power of two <= 32); every lane of a
// group gets its group's sum. The whole warp must call it.
template <int LANES>
__device__ __forceinline__ float lane_group_sum(float v) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds one float per warp, and is
// reusable after the call returns (a barrier guards it).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = ceil_div(blockDim.x, kWarpSize);
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// Maximum over aligned groups of LANES consecutive lanes, as lane_group_sum.
template <int LANES>
__device__ __forceinline__ float lane_group_max(float v) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Maximum over the block, as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = ceil_div(blockDim.x, kWarpSize);
  v = lane_group_max<kWarpSize>(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return lane_group_max<kWarpSize>(v);
}

// How a block splits into row groups of TPR threads, for kernels that keep a row in registers:
// TPR <= 32 is lanes of a warp per row (several groups per block), larger TPR is the whole block on
// one row.
template <int TPR>
struct RowGroups {
  static constexpr bool kLanesPerRow = TPR <= kWarpSize;
  int count = kLanesPerRow ? blockDim.x / TPR : 1;              // row groups in the block
  int index = kLanesPerRow ? threadIdx.x / TPR : 0;             // this thread's group
  int thread = kLanesPerRow ? threadIdx.x % TPR : threadIdx.x;  // this thread within its group
  // Sum and maximum over the thread's row group; every thread of the block must call them.
  __device__ float sum(float v, float* scratch) const {
    if constexpr (kLanesPerRow)
      return lane_group_sum<TPR>(v);
    else
      return block_sum(v, scratch);
  }
  __device__ float max(float v, float* scratch) const {
    if constexpr (kLanesPerRow)
      return lane_group_max<TPR>(v);
    else
      return block_max(v, scratch);
  }
};

}  // namespace fusekit::kernels
