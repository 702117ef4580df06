// Device conversions between float and the 16-bit wire words (uint16_t bits of T = __half or
// __nv_bfloat16, round to nearest even), shared by dp/'s kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "kernels/common.cuh"

namespace fusekit::dp::detail {

template <class T>
__device__ __forceinline__ float from_wire(uint16_t bits) {
  T v;
  memcpy(&v, &bits, sizeof v);
  return kernels::to_float(v);
}

template <class T>
__device__ __forceinline__ uint16_t to_wire(float x) {
  const T v = kernels::from_float<T>(x);
  uint16_t bits;
  memcpy(&bits, &v, sizeof bits);
  return bits;
}

// Whether a wire word is nonzero (either sign of zero counts as zero).
__device__ __forceinline__ bool nonzero_wire(uint16_t bits) { return (bits & 0x7FFFu) != 0; }

}  // namespace fusekit::dp::detail
