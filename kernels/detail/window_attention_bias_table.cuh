// Swin window attention: the relative-position bias. The forward gathers [heads, N, N] from the table
// through the index; the backward sums the blocks' bias-gradient slices of the workspace
// (window_bias_reduce_kernel) and folds [heads, N, N] into the table through the index
// (window_table_gradient_kernel: a warp per table entry, a lane per head).
#pragma once

#include "kernels/detail/window_attention_common.cuh"

namespace fusekit::kernels {
// Included by window_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

// The gathered bias: bias[h, i, j] = table[index[i, j], h], one thread per element.
template <class T>
__global__ void window_bias_gather_kernel(const T* __restrict__ table, const int32_t* __restrict__ index,
                                          float* __restrict__ bias, int heads, int pairs) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= heads * pairs) return;
  const int h = e / pairs, ij = e % pairs;
  bias[e] = to_float(table[static_cast<size_t>(index[ij]) * heads + h]);
}

// dbias[h, i, j] = sum over slices of partials[slice, h, i, j]: block (32 x kSliceGroups) threads
// for 32 consecutive elements; thread (x, y) sums the slices y, y + kSliceGroups, ... of element x,
// then row y = 0 adds the groups in order (deterministic; enough loads in flight for ~1000 slices).
constexpr int kSliceGroups = 8;
__global__ void __launch_bounds__(kWarpSize* kSliceGroups)
    window_bias_reduce_kernel(const float* __restrict__ partials, float* __restrict__ dbias, int count, int slices) {
  __shared__ float group_sums[kSliceGroups][kWarpSize];
  const int e = blockIdx.x * kWarpSize + threadIdx.x;
  float sum = 0.f;
  if (e < count) {
    for (int s = threadIdx.y; s < slices; s += kSliceGroups) sum += partials[static_cast<size_t>(s) * count + e];
  }
  group_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && e < count) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kSliceGroups; ++y) total += group_sums[y][threadIdx.x];
    dbias[e] = total;
  }
}

// dtable[t, h] = sum of dbias[h, i, j] over the (i, j) with index[i, j] = t: a warp per entry t
// finds the matching pairs 32 at a time (ballot) and each lane adds them up for heads lane and
// lane + 32, in pair order (deterministic).
template <class T>
__global__ void window_table_gradient_kernel(const float* __restrict__ dbias, const int32_t* __restrict__ index,
                                             T* __restrict__ dtable, int entries, int heads, int pairs) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (t >= entries) return;  // the whole warp
  float first = 0.f, second = 0.f;
  for (int base = 0; base < pairs; base += kWarpSize) {
    const int ij = base + lane;
    unsigned match = __ballot_sync(0xffffffffu, ij < pairs && index[ij] == t);
    while (match) {
      const int m = base + __ffs(match) - 1;
      match &= match - 1;
      if (lane < heads) first += dbias[static_cast<size_t>(lane) * pairs + m];
      if (lane + kWarpSize < heads) second += dbias[static_cast<size_t>(lane + kWarpSize) * pairs + m];
    }
  }
  if (lane < heads) dtable[static_cast<size_t>(t) * heads + lane] = from_float<T>(first);
  if (lane + kWarpSize < heads) dtable[static_cast<size_t>(t) * heads + lane + kWarpSize] = from_float<T>(second);
}

}  // namespace
}  // namespace fusekit::kernels
