// The block-wide exclusive scan that dp/'s compactions share (the top-k selection's, the sparse
// collective's): entries written in index order without atomics.
#pragma once

#include "kernels/common.cuh"

namespace fusekit::dp {

// Exclusive scan over the block (blockDim.x a multiple of 32, at most 1024); `total` gets the sum.
// `warp_totals` holds 32 values and is reusable after the call returns.
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned v, unsigned* warp_totals, unsigned& total) {
  const int lane = threadIdx.x % kernels::kWarpSize, warp = threadIdx.x / kernels::kWarpSize;
  const int warps = blockDim.x / kernels::kWarpSize;
  unsigned x = v;
#pragma unroll
  for (int o = 1; o < kernels::kWarpSize; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // warp_totals may still be read by an earlier call
  if (lane == kernels::kWarpSize - 1) warp_totals[warp] = x;
  __syncthreads();
  if (warp == 0) {
    unsigned t = lane < warps ? warp_totals[lane] : 0u;
#pragma unroll
    for (int o = 1; o < kernels::kWarpSize; o <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    warp_totals[lane] = t;
  }
  __syncthreads();
  total = warp_totals[warps - 1];
  return (warp > 0 ? warp_totals[warp - 1] : 0u) + x - v;
}

}  // namespace fusekit::dp
