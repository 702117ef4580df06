// The device side of the sparse collectives (dp/sparse_collective.h): launchers of the kernels that
// dp/sparse_collective.cpp runs between its NCCL calls. Plain C++17 and CUDA, no NCCL. Values are
// 16-bit words of the wire type `wire` (DType f16 or bf16); every launch goes on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace fusekit::dp::detail {

constexpr uint64_t kSliceTile = 4096;  // elements of a slice per block when rounding and compacting

inline uint64_t slice_tiles(uint64_t elements) { return (elements + kSliceTile - 1) / kSliceTile; }

// Zeroes counts[0, bins], then counts[bins] = the entries that break "strictly increasing below
// elements", and (bins > 0) counts[index / width] += 1 for every other entry.
void validate_and_histogram(const uint32_t* indices, uint64_t count, uint32_t elements, uint32_t width,
                            unsigned long long* counts, int bins, cudaStream_t stream);

// out[indices[i]] += values[i] for i < count: one source rank's entries (distinct indices), in fp32.
void scatter_add(const uint32_t* indices, const uint16_t* values, uint64_t count, kernels::DType wire, float* out,
                 cudaStream_t stream);
// out[indices[i]] = values[i] for i < count.
void scatter(const uint32_t* indices, const uint16_t* values, uint64_t count, kernels::DType wire, float* out,
             cudaStream_t stream);
// out[i] = stage[i] for i in [begin, end).
void widen(const uint16_t* stage, uint64_t begin, uint64_t end, kernels::DType wire, float* out, cudaStream_t stream);

// out[i] = in[i] converted to `to` (fp32, fp16 or bf16; round to nearest even) for i < elements;
// *nonfinite (device; not zeroed here) += the count of non-finite in[i].
void narrow(const float* in, uint64_t elements, kernels::DType to, void* out, unsigned long long* nonfinite,
            cudaStream_t stream);

// counts[b] (kMagnitudeBins of them, zeroed here) = the nonzero out[i], i in [begin, end), whose
// magnitude's bits (sign cleared) >> kMagnitudeShift are b (coarse_bin < 0), or of those whose
// coarse bin is coarse_bin, the ones with (bits >> kFineShift) & (kMagnitudeBins - 1) == b
// (dp/slice_plan.h's re-selection, its two levels).
void magnitude_histogram(const float* out, uint64_t begin, uint64_t end, int coarse_bin, unsigned long long* counts,
                         cudaStream_t stream);

// Over [begin, end): stage[i] = out[i] rounded to the wire type (-0 as +0), out[i] = stage[i] widened back;
// an out[i] whose magnitude's bits are below keep_bits counts as 0 (re-selection; 0 keeps all).
// *nonzero (device) = the count of nonzero words, tile_offsets (slice_tiles(end - begin) of them)
// = each tile's first output position for compact_slice. tile_counts is scratch of the same size.
void round_slice(float* out, uint16_t* stage, uint64_t begin, uint64_t end, kernels::DType wire, unsigned* tile_counts,
                 unsigned* tile_offsets, unsigned long long* nonzero, cudaStream_t stream, uint32_t keep_bits = 0);
// The nonzero words of stage[begin, end) as (index, value) entries in index order.
void compact_slice(const uint16_t* stage, uint64_t begin, uint64_t end, const unsigned* tile_offsets,
                   uint32_t* out_indices, uint16_t* out_values, cudaStream_t stream);

// The bucketed index form (dp/slice_plan.h's bucket_encode and bucket_decode, on the device).
// Entries [0, count) have strictly increasing indices, each in one of `slices` slices with element
// edges edges[0 .. slices] (device): low[e] = (index - edges[r]) & 0xFFFF, and
// counts[bucket_base[r] + ((index - edges[r]) >> kBucketShift)] += 1 (counts zeroed by the caller;
// bucket_base (device, slices + 1) the first bucket of each slice).
void bucket_encode(const uint32_t* indices, uint64_t count, const unsigned long long* edges,
                   const unsigned long long* bucket_base, int slices, uint16_t* low, unsigned* counts,
                   cudaStream_t stream);
// starts[b] = counts[0] + ... + counts[b - 1] for b < buckets; *total = their sum.
void bucket_scan(const unsigned* counts, int buckets, unsigned* starts, unsigned long long* total, cudaStream_t stream);
// indices[j] = begin + (b << kBucketShift) + low[j] for j < count, b the last bucket with
// starts[b] <= j (the one holding entry j; empty buckets share their start with the next).
void bucket_decode(const uint16_t* low, uint64_t count, const unsigned* starts, int buckets, uint64_t begin,
                   uint32_t* indices, cudaStream_t stream);

}  // namespace fusekit::dp::detail
