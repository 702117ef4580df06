// The sparse collectives' kernels (see detail/sparse_collective_kernels.h; the protocol around them
// is dp/sparse_collective.cpp).
//
//   validate + histogram   one pass over a rank's indices: each thread takes a run of consecutive
//                          entries, checks index[i - 1] < index[i] < elements, and adds per bin
//                          once per run (indices are sorted, so a run touches few bins);
//   scatter_add            out[index] += value for one source rank (indices of one rank are
//                          distinct: no atomics, and the caller fixes the order of the ranks);
//   magnitude histogram    re-selection's counts of the owner's nonzero sums by magnitude bin, or
//                          of one bin's sums by fine bin (shared-memory atomics per block, then
//                          one global add per bin);
//   round + count          per tile of 4096 elements of the owner's slice: the 16-bit sums into the
//                          stage (those under the re-selection threshold as zero), widened back
//                          into out, nonzero words counted per tile, then one block scans the
//                          tiles' counts;
//   compact                each tile writes its nonzero words in index order (a block-wide scan);
//   widen / scatter        the other ranks' slices into out;
//   bucket encode / decode the bucketed index form: a thread per entry, a binary search for its
//                          slice (encode) or its bucket among the scanned counts (decode).
#include "dp/detail/sparse_collective_kernels.h"

#include <algorithm>

#include "dp/detail/block_scan.cuh"
#include "dp/detail/wire.cuh"
#include "dp/slice_plan_constants.h"
#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"

namespace fusekit::dp::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kRun = 16;   // entries per thread in the histogram pass
constexpr int kGroup = 4;  // consecutive elements per thread per step of a tile
constexpr int kScanThreads = 1024;
constexpr unsigned kMaxBlocks = 1u << 20;
static_assert(kSliceTile % (kThreads * kGroup) == 0, "a tile is whole steps");

unsigned blocks_for(uint64_t items, uint64_t per_block) {
  return static_cast<unsigned>(std::clamp<uint64_t>((items + per_block - 1) / per_block, 1, kMaxBlocks));
}

// ---- CUDA kernels

// Counts entries that break "strictly increasing below elements" into hist[bins], and (bins > 0)
// each entry's bin index / width into hist[bin].
__global__ void __launch_bounds__(kThreads)
    validate_histogram_kernel(const uint32_t* __restrict__ indices, uint64_t count, uint32_t elements, uint32_t width,
                              unsigned long long* __restrict__ hist, int bins) {
  for (uint64_t start = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kRun; start < count;
       start += static_cast<uint64_t>(gridDim.x) * blockDim.x * kRun) {
    const uint64_t end = start + kRun < count ? start + kRun : count;
    unsigned long long invalid = 0, run = 0;
    uint32_t previous = start > 0 ? indices[start - 1] : 0, bin = 0;
    for (uint64_t i = start; i < end; ++i) {
      const uint32_t index = indices[i];
      if (index >= elements || (i > 0 && index <= previous)) {
        ++invalid;
      } else if (bins > 0) {
        const uint32_t b = index / width;
        if (run > 0 && b != bin) {
          atomicAdd(&hist[bin], run);
          run = 0;
        }
        bin = b;
        ++run;
      }
      previous = index;
    }
    if (run > 0) atomicAdd(&hist[bin], run);
    if (invalid > 0) atomicAdd(&hist[bins], invalid);
  }
}

// out[indices[i]] += values[i]: one source rank's entries (distinct indices).
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_add_kernel(const uint32_t* __restrict__ indices, const uint16_t* __restrict__ values, uint64_t count,
                       float* __restrict__ out) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    out[indices[i]] += from_wire<T>(values[i]);
  }
}

// out[indices[i]] = values[i]: a slice that arrived as entries, into zeros.
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const uint32_t* __restrict__ indices, const uint16_t* __restrict__ values, uint64_t count,
                   float* __restrict__ out) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    out[indices[i]] = from_wire<T>(values[i]);
  }
}

// out[i] = stage[i] over [begin, end): a slice that arrived dense.
template <class T>
__global__ void __launch_bounds__(kThreads)
    widen_kernel(const uint16_t* __restrict__ stage, uint64_t begin, uint64_t end, float* __restrict__ out) {
  for (uint64_t i = begin + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_wire<T>(stage[i]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    narrow_kernel(const float* __restrict__ in, uint64_t elements, T* __restrict__ out, unsigned long long* nonfinite) {
  unsigned bad = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < elements;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float x = in[i];
    bad += isfinite(x) ? 0u : 1u;
    out[i] = kernels::from_float<T>(x);
  }
  for (int offset = kernels::kWarpSize / 2; offset > 0; offset /= 2) bad += __shfl_down_sync(0xffffffffu, bad, offset);
  if ((threadIdx.x % kernels::kWarpSize) == 0 && bad != 0) atomicAdd(nonfinite, static_cast<unsigned long long>(bad));
}

// One block per tile of the owner's slice: the 16-bit sums into the stage and back into out (so
// the owner holds what the others receive), and the tile's count of nonzero words.
template <class T>
__global__ void __launch_bounds__(kThreads)
    round_slice_kernel(float* __restrict__ out, uint16_t* __restrict__ stage, uint64_t begin, uint64_t end,
                       unsigned* __restrict__ tile_counts, uint32_t keep_bits) {
  __shared__ unsigned warp_totals[kernels::kWarpSize];
  const uint64_t tile_begin = begin + static_cast<uint64_t>(blockIdx.x) * kSliceTile;
  const uint64_t tile_end = tile_begin + kSliceTile < end ? tile_begin + kSliceTile : end;
  unsigned nonzero = 0;
  for (uint64_t i = tile_begin + threadIdx.x; i < tile_end; i += blockDim.x) {
    float sum = out[i];
    if ((__float_as_uint(sum) & 0x7FFFFFFFu) < keep_bits) sum = 0.0f;  // re-selection: not kept
    uint16_t bits = to_wire<T>(sum);
    if (!nonzero_wire(bits)) bits = 0;  // a sum that rounds to -0 travels as +0, as a dropped entry does
    stage[i] = bits;
    out[i] = from_wire<T>(bits);
    nonzero += nonzero_wire(bits) ? 1u : 0u;
  }
  unsigned total;
  block_exclusive_scan(nonzero, warp_totals, total);
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

// The magnitudes of the nonzero sums of out[begin, end) by bin (dp/slice_plan.h's kMagnitudeBins:
// the float's bits below the sign, shifted by kMagnitudeShift), counted in shared memory per block;
// with coarse_bin >= 0, only the values in that coarse bin, by their next 11 bits (kFineShift).
__global__ void __launch_bounds__(kThreads)
    magnitude_histogram_kernel(const float* __restrict__ out, uint64_t begin, uint64_t end, int coarse_bin,
                               unsigned long long* __restrict__ counts) {
  __shared__ unsigned local[kMagnitudeBins];
  for (int b = threadIdx.x; b < kMagnitudeBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = begin + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
    const uint32_t bits = __float_as_uint(out[i]) & 0x7FFFFFFFu;
    if (bits == 0) continue;
    if (coarse_bin < 0) {
      atomicAdd(&local[bits >> kMagnitudeShift], 1u);
    } else if (static_cast<int>(bits >> kMagnitudeShift) == coarse_bin) {
      atomicAdd(&local[(bits >> kFineShift) & (kMagnitudeBins - 1)], 1u);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kMagnitudeBins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&counts[b], static_cast<unsigned long long>(local[b]));
}

// A thread per entry: its slice (the last r with edges[r] <= index), the low bits of its offset in
// the slice, and its bucket's count.
__global__ void __launch_bounds__(kThreads)
    bucket_encode_kernel(const uint32_t* __restrict__ indices, uint64_t count,
                         const unsigned long long* __restrict__ edges,
                         const unsigned long long* __restrict__ bucket_base, int slices, uint16_t* __restrict__ low,
                         unsigned* __restrict__ counts) {
  for (uint64_t e = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const unsigned long long index = indices[e];
    int lo = 0, hi = slices - 1;  // the last slice whose first element is <= index
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (edges[mid] <= index)
        lo = mid;
      else
        hi = mid - 1;
    }
    const unsigned long long local = index - edges[lo];
    low[e] = static_cast<uint16_t>(local & 0xFFFFu);
    atomicAdd(&counts[bucket_base[lo] + (local >> kBucketShift)], 1u);
  }
}

// A thread per entry: the bucket holding entry j (the last with starts[b] <= j), then its index.
__global__ void __launch_bounds__(kThreads)
    bucket_decode_kernel(const uint16_t* __restrict__ low, uint64_t count, const unsigned* __restrict__ starts,
                         int buckets, uint64_t begin, uint32_t* __restrict__ indices) {
  for (uint64_t j = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    int lo = 0, hi = buckets - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (starts[mid] <= j)
        lo = mid;
      else
        hi = mid - 1;
    }
    indices[j] = static_cast<uint32_t>(begin + (static_cast<uint64_t>(lo) << kBucketShift) + low[j]);
  }
}

// One block: the exclusive scan of the tiles' counts, and their sum into *total.
__global__ void __launch_bounds__(kScanThreads)
    scan_tiles_kernel(const unsigned* __restrict__ tile_counts, int tiles, unsigned* __restrict__ tile_offsets,
                      unsigned long long* __restrict__ total) {
  __shared__ unsigned warp_totals[kernels::kWarpSize];
  unsigned running = 0;
  for (int base = 0; base < tiles; base += blockDim.x) {
    const int t = base + static_cast<int>(threadIdx.x);
    const unsigned v = t < tiles ? tile_counts[t] : 0u;
    unsigned sum;
    const unsigned offset = block_exclusive_scan(v, warp_totals, sum);
    if (t < tiles) tile_offsets[t] = running + offset;
    running += sum;
  }
  if (threadIdx.x == 0) *total = running;
}

// One block per tile: the nonzero words of the stage as (index, value) entries in index order.
__global__ void __launch_bounds__(kThreads)
    compact_slice_kernel(const uint16_t* __restrict__ stage, uint64_t begin, uint64_t end,
                         const unsigned* __restrict__ tile_offsets, uint32_t* __restrict__ out_indices,
                         uint16_t* __restrict__ out_values) {
  __shared__ unsigned warp_totals[kernels::kWarpSize];
  const uint64_t tile_begin = begin + static_cast<uint64_t>(blockIdx.x) * kSliceTile;
  const uint64_t tile_end = tile_begin + kSliceTile < end ? tile_begin + kSliceTile : end;
  uint64_t next = tile_offsets[blockIdx.x];
  // Every thread runs the same number of steps: the scan inside needs the whole block.
  for (uint64_t step = tile_begin; step < tile_end; step += kThreads * kGroup) {
    const uint64_t i = step + static_cast<uint64_t>(threadIdx.x) * kGroup;
    uint16_t words[kGroup];
    unsigned flags = 0;
    for (int e = 0; e < kGroup; ++e) {
      words[e] = i + e < tile_end ? stage[i + e] : 0;
      flags |= (nonzero_wire(words[e]) ? 1u : 0u) << e;
    }
    unsigned total;
    uint64_t out = next + block_exclusive_scan(__popc(flags), warp_totals, total);
    for (int e = 0; e < kGroup; ++e) {
      if (flags >> e & 1u) {
        out_indices[out] = static_cast<uint32_t>(i + e);
        out_values[out] = words[e];
        ++out;
      }
    }
    next += total;
  }
}

}  // namespace

// ---- kernel launchers

void validate_and_histogram(const uint32_t* indices, uint64_t count, uint32_t elements, uint32_t width,
                            unsigned long long* counts, int bins, cudaStream_t stream) {
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(counts, 0, (static_cast<size_t>(bins) + 1) * sizeof *counts, stream));
  if (count == 0) return;
  validate_histogram_kernel<<<blocks_for(count, uint64_t{kThreads} * kRun), kThreads, 0, stream>>>(
      indices, count, elements, width, counts, bins);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void scatter_add(const uint32_t* indices, const uint16_t* values, uint64_t count, kernels::DType wire, float* out,
                 cudaStream_t stream) {
  if (count == 0) return;
  kernels::dispatch_16bit_dtype(wire, "sparse collective", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_kernel<T><<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, values, count, out);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void scatter(const uint32_t* indices, const uint16_t* values, uint64_t count, kernels::DType wire, float* out,
             cudaStream_t stream) {
  if (count == 0) return;
  kernels::dispatch_16bit_dtype(wire, "sparse collective", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_kernel<T><<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, values, count, out);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void widen(const uint16_t* stage, uint64_t begin, uint64_t end, kernels::DType wire, float* out, cudaStream_t stream) {
  if (end <= begin) return;
  kernels::dispatch_16bit_dtype(wire, "sparse collective", [&](auto tag) {
    using T = typename decltype(tag)::type;
    widen_kernel<T><<<blocks_for(end - begin, kThreads), kThreads, 0, stream>>>(stage, begin, end, out);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void narrow(const float* in, uint64_t elements, kernels::DType to, void* out, unsigned long long* nonfinite,
            cudaStream_t stream) {
  if (elements == 0) return;
  kernels::dispatch_dtype(to, "gradient narrowing", [&](auto tag) {
    using T = typename decltype(tag)::type;
    narrow_kernel<T>
        <<<blocks_for(elements, kThreads * 8), kThreads, 0, stream>>>(in, elements, static_cast<T*>(out), nonfinite);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void magnitude_histogram(const float* out, uint64_t begin, uint64_t end, int coarse_bin, unsigned long long* counts,
                         cudaStream_t stream) {
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(counts, 0, kMagnitudeBins * sizeof *counts, stream));
  if (end <= begin) return;
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(blocks_for(end - begin, kThreads * 16), 1024));
  magnitude_histogram_kernel<<<blocks, kThreads, 0, stream>>>(out, begin, end, coarse_bin, counts);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void bucket_encode(const uint32_t* indices, uint64_t count, const unsigned long long* edges,
                   const unsigned long long* bucket_base, int slices, uint16_t* low, unsigned* counts,
                   cudaStream_t stream) {
  if (count == 0 || slices < 1) return;
  bucket_encode_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(indices, count, edges, bucket_base, slices,
                                                                             low, counts);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void bucket_scan(const unsigned* counts, int buckets, unsigned* starts, unsigned long long* total,
                 cudaStream_t stream) {
  if (buckets < 1) {
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof *total, stream));
    return;
  }
  scan_tiles_kernel<<<1, kScanThreads, 0, stream>>>(counts, buckets, starts, total);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void bucket_decode(const uint16_t* low, uint64_t count, const unsigned* starts, int buckets, uint64_t begin,
                   uint32_t* indices, cudaStream_t stream) {
  if (count == 0 || buckets < 1) return;
  bucket_decode_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(low, count, starts, buckets, begin,
                                                                             indices);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void round_slice(float* out, uint16_t* stage, uint64_t begin, uint64_t end, kernels::DType wire, unsigned* tile_counts,
                 unsigned* tile_offsets, unsigned long long* nonzero, cudaStream_t stream, uint32_t keep_bits) {
  const uint64_t tiles = end > begin ? slice_tiles(end - begin) : 0;
  if (tiles == 0) {
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(nonzero, 0, sizeof *nonzero, stream));
    return;
  }
  kernels::dispatch_16bit_dtype(wire, "sparse collective", [&](auto tag) {
    using T = typename decltype(tag)::type;
    round_slice_kernel<T>
        <<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(out, stage, begin, end, tile_counts, keep_bits);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  scan_tiles_kernel<<<1, kScanThreads, 0, stream>>>(tile_counts, static_cast<int>(tiles), tile_offsets, nonzero);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void compact_slice(const uint16_t* stage, uint64_t begin, uint64_t end, const unsigned* tile_offsets,
                   uint32_t* out_indices, uint16_t* out_values, cudaStream_t stream) {
  if (end <= begin) return;
  compact_slice_kernel<<<static_cast<unsigned>(slice_tiles(end - begin)), kThreads, 0, stream>>>(
      stage, begin, end, tile_offsets, out_indices, out_values);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::dp::detail
