// Layer-wise top-k selection with error feedback (see topk_selection.h for the math, the layouts
// and the tolerance).
//
// Design. One select() is a fixed sequence of launches with no host synchronization:
//   sample     one block per layer: a strided sample of |residual + gradient|, sorted (bitonic, in
//              shared memory), gives the estimate and the first 16 candidate thresholds, 1/8 octave
//              apart around it;
//   count x 4  one block per tile of 8192 elements: counts |x| >= each candidate (the first pass
//              also stores residual += gradient), per tile and per layer; after each pass one thread
//              per layer either accepts a candidate or places the next 16; tiles of layers already
//              decided return at once, so a pass that nobody needs costs two small launches;
//   scan       one block per layer: exclusive scan of the chosen candidate's tile counts;
//   compact    one block per tile: flags, a block-wide scan, the pairs written in index order, and
//              the sent entries zeroed in the residual.
// Every pass over the data reads 16-byte vectors of four consecutive elements per thread (where the
// layer's offset and the pointers allow it; else scalar loads of the same elements), contiguous
// across a warp. Candidate thresholds are compared as float bit patterns.
#include "dp/detail/block_scan.cuh"
#include "dp/topk_selection.h"
#include "dp/topk_threshold.h"
#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace fusekit::dp {
namespace {

using kernels::Vec;

constexpr int kThreads = 256;
constexpr int kSampleThreads = 512;
constexpr int kGroup = 4;  // consecutive elements per thread per step
static_assert(kSelectionCandidates == kThresholdCandidates, "one count per candidate");
static_assert(kSelectionTile % (kThreads * kGroup) == 0, "a tile is whole steps");

struct LayerDescriptor {
  int64_t offset, size, output_offset;
  int first_tile, tiles;
};

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The (up to) four elements of residual + gradient at layer index i of a tile's step: `count`
// of them valid. With kAccumulate the sum is stored into the residual.
template <class T, bool kAccumulate>
__device__ __forceinline__ int load_group(const T* __restrict__ gradient, float* __restrict__ residual, int64_t i,
                                          int64_t end, bool vectorized, float (&x)[kGroup]) {
  const int count = static_cast<int>(min64(kGroup, end - i));
  if (count <= 0) return 0;
  if (vectorized && count == kGroup) {
    Vec<float, kGroup> r = Vec<float, kGroup>::load(residual + i);
    if constexpr (kAccumulate) {
      const Vec<T, kGroup> g = Vec<T, kGroup>::load_stream(gradient + i);
#pragma unroll
      for (int e = 0; e < kGroup; ++e) r.v[e] = r.v[e] + kernels::to_float(g.v[e]);
      r.store(residual + i);
    }
#pragma unroll
    for (int e = 0; e < kGroup; ++e) x[e] = r.v[e];
    return kGroup;
  }
  for (int e = 0; e < count; ++e) {
    float r = residual[i + e];
    if constexpr (kAccumulate) {
      r = r + kernels::to_float(gradient[i + e]);
      residual[i + e] = r;
    }
    x[e] = r;
  }
  return count;
}

// What the selection ranks: |x|, or with AdamW's frozen second moment v (kScored) the step x would
// take, |x| / (sqrt(v[i]) + eps). magnitude_bits_of drops the sign. A template flag, so that the
// plain selection compiles as it did without the option.
template <bool kScored>
__device__ __forceinline__ float score_of(float x, const float* __restrict__ v, int64_t i, float eps) {
  if constexpr (kScored) {
    return x / (sqrtf(v[i]) + eps);
  } else {
    return x;
  }
}

// ---- CUDA kernels

// One block per layer: the sample, its sort, k and the first candidates.
template <class T, bool kScored>
__global__ void __launch_bounds__(kSampleThreads)
    selection_sample_kernel(const T* __restrict__ gradient, const float* __restrict__ residual,
                            const float* __restrict__ second_moment, float eps,
                            const LayerDescriptor* __restrict__ layers, ThresholdSearch* __restrict__ states,
                            double density) {
  constexpr int N = kSelectionSampleSize;
  __shared__ float sample[N];
  const LayerDescriptor layer = layers[blockIdx.x];
  const int64_t n = layer.size;
  const int m = static_cast<int>(min64(n, N));
  for (int j = threadIdx.x; j < N; j += blockDim.x) {
    if (j < m) {
      const int64_t i = layer.offset + static_cast<int64_t>(j) * n / m;
      // As the first count pass sums it.
      sample[j] = fabsf(score_of<kScored>(residual[i] + kernels::to_float(gradient[i]), second_moment, i, eps));
    } else {
      sample[j] = -1.f;  // sorts below every magnitude
    }
  }
  __syncthreads();
  for (int size = 2; size <= N; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < N; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool ascending = (i & size) == 0;
          const float a = sample[i], b = sample[j];
          if ((a > b) == ascending) {
            sample[i] = b;
            sample[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  if (threadIdx.x != 0) return;
  const int sample_k =
      static_cast<int>(min64(max64(static_cast<int64_t>(ceil(density * static_cast<double>(m))), 1), m));
  threshold_search_start(states[blockIdx.x], n, density, sample[N - sample_k]);  // the sample's sample_k-th largest
}

// One block per tile: counts of |x| >= each candidate, per tile and added to the layer's.
template <class T, bool kAccumulate, bool kScored>
__global__ void __launch_bounds__(kThreads)
    selection_count_kernel(const T* __restrict__ gradient, float* __restrict__ residual,
                           const float* __restrict__ second_moment, float eps,
                           const LayerDescriptor* __restrict__ layers, const int* __restrict__ tile_layers,
                           ThresholdSearch* __restrict__ states, unsigned* __restrict__ tile_counts, bool aligned) {
  const int l = tile_layers[blockIdx.x];
  if (!kAccumulate && states[l].done) return;
  const LayerDescriptor layer = layers[l];
  __shared__ uint32_t candidates[kSelectionCandidates];
  __shared__ unsigned warp_counts[kThreads / kernels::kWarpSize][kSelectionCandidates];
  if (threadIdx.x < kSelectionCandidates) candidates[threadIdx.x] = states[l].candidates[threadIdx.x];
  __syncthreads();
  uint32_t c[kSelectionCandidates];
#pragma unroll
  for (int j = 0; j < kSelectionCandidates; ++j) c[j] = candidates[j];
  unsigned counts[kSelectionCandidates] = {};

  const int64_t start = static_cast<int64_t>(blockIdx.x - layer.first_tile) * kSelectionTile;
  const int64_t end = min64(start + kSelectionTile, layer.size);
  const bool vectorized = aligned && layer.offset % kGroup == 0;
  const T* g = gradient == nullptr ? nullptr : gradient + layer.offset;
  float* r = residual + layer.offset;
  const float* v = second_moment == nullptr ? nullptr : second_moment + layer.offset;
  for (int64_t i = start + static_cast<int64_t>(threadIdx.x) * kGroup; i < end; i += kThreads * kGroup) {
    float x[kGroup];
    const int valid = load_group<T, kAccumulate>(g, r, i, end, vectorized, x);
    for (int e = 0; e < valid; ++e) {
      const uint32_t bits = magnitude_bits_of(score_of<kScored>(x[e], v, i + e, eps));
#pragma unroll
      for (int j = 0; j < kSelectionCandidates; ++j) counts[j] += bits >= c[j] ? 1u : 0u;
    }
  }
  const int lane = threadIdx.x % kernels::kWarpSize, warp = threadIdx.x / kernels::kWarpSize;
#pragma unroll
  for (int j = 0; j < kSelectionCandidates; ++j) {
    unsigned n = counts[j];
#pragma unroll
    for (int o = kernels::kWarpSize / 2; o > 0; o /= 2) n += __shfl_xor_sync(0xffffffffu, n, o);
    if (lane == 0) warp_counts[warp][j] = n;
  }
  __syncthreads();
  if (threadIdx.x < kSelectionCandidates) {
    unsigned total = 0;
    for (int w = 0; w < kThreads / kernels::kWarpSize; ++w) total += warp_counts[w][threadIdx.x];
    tile_counts[static_cast<int64_t>(blockIdx.x) * kSelectionCandidates + threadIdx.x] = total;
    atomicAdd(&states[l].counts[threadIdx.x], static_cast<unsigned long long>(total));
  }
}

// One thread per layer after each counting pass: accept a candidate, or place the next ones.
__global__ void selection_decide_kernel(ThresholdSearch* __restrict__ states, int layer_count, int pass, bool last) {
  const int l = blockIdx.x * blockDim.x + threadIdx.x;
  if (l >= layer_count) return;
  threshold_search_step(states[l], pass, last);
}

// One block per layer: each tile's output offset, the exclusive scan of its chosen count.
__global__ void __launch_bounds__(kThreads)
    selection_scan_kernel(const LayerDescriptor* __restrict__ layers, const ThresholdSearch* __restrict__ states,
                          const unsigned* __restrict__ tile_counts, unsigned* __restrict__ tile_offsets) {
  __shared__ unsigned warp_totals[kernels::kWarpSize];
  const LayerDescriptor layer = layers[blockIdx.x];
  const int chosen = states[blockIdx.x].chosen;
  unsigned running = 0;
  for (int base = 0; base < layer.tiles; base += kThreads) {
    const int t = base + static_cast<int>(threadIdx.x);
    const unsigned v =
        t < layer.tiles ? tile_counts[static_cast<int64_t>(layer.first_tile + t) * kSelectionCandidates + chosen] : 0u;
    unsigned total;
    const unsigned offset = block_exclusive_scan(v, warp_totals, total);
    if (t < layer.tiles) tile_offsets[layer.first_tile + t] = running + offset;
    running += total;
  }
}

// One block per tile: the selected pairs in index order; sent entries leave the residual.
template <bool kScored>
__global__ void __launch_bounds__(kThreads)
    selection_compact_kernel(float* __restrict__ residual, const float* __restrict__ second_moment, float eps,
                             const LayerDescriptor* __restrict__ layers, const int* __restrict__ tile_layers,
                             const ThresholdSearch* __restrict__ states, const unsigned* __restrict__ tile_offsets,
                             int32_t* __restrict__ out_indices, float* __restrict__ out_values, bool aligned) {
  __shared__ unsigned warp_totals[kernels::kWarpSize];
  const int l = tile_layers[blockIdx.x];
  const uint32_t threshold = states[l].threshold_bits;
  if (threshold == kThresholdNothing) return;
  const LayerDescriptor layer = layers[l];
  const int64_t start = static_cast<int64_t>(blockIdx.x - layer.first_tile) * kSelectionTile;
  const int64_t end = min64(start + kSelectionTile, layer.size);
  const bool vectorized = aligned && layer.offset % kGroup == 0;
  float* r = residual + layer.offset;
  const float* v = second_moment == nullptr ? nullptr : second_moment + layer.offset;
  int64_t next = layer.output_offset + tile_offsets[blockIdx.x];
  // Every thread runs the same number of steps: the scan inside needs the whole block.
  for (int64_t step = start; step < end; step += kThreads * kGroup) {
    const int64_t i = step + static_cast<int64_t>(threadIdx.x) * kGroup;
    float x[kGroup];
    const int valid = load_group<float, false>(nullptr, r, i, end, vectorized, x);
    unsigned flags = 0;
    for (int e = 0; e < valid; ++e)
      flags |= (magnitude_bits_of(score_of<kScored>(x[e], v, i + e, eps)) >= threshold ? 1u : 0u) << e;
    unsigned total;
    const unsigned before = block_exclusive_scan(__popc(flags), warp_totals, total);
    int64_t out = next + before;
    for (int e = 0; e < valid; ++e) {
      if (flags >> e & 1u) {
        out_indices[out] = static_cast<int32_t>(i + e);
        out_values[out] = x[e];
        r[i + e] = 0.f;
        ++out;
      }
    }
    next += total;
  }
}

}  // namespace

// ---- kernel launchers

TopkSelection::TopkSelection(std::vector<LayerSpan> layers, double max_density)
    : layers_(std::move(layers)), max_density_(max_density) {
  if (layers_.empty()) throw std::invalid_argument("top-k selection: no layers");
  if (!(max_density > 0 && max_density <= 1))
    throw std::invalid_argument("top-k selection: max_density must be in (0, 1]");
  std::vector<LayerDescriptor> table;
  std::vector<int> tile_layers;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerSpan& span = layers_[l];
    if (span.size < 1 || span.size >= (int64_t{1} << 31) || span.offset < 0)
      throw std::invalid_argument("top-k selection: layer " + std::to_string(l) + " has offset " +
                                  std::to_string(span.offset) + " and size " + std::to_string(span.size) +
                                  " (sizes from 1 to 2^31 - 1)");
    const int tiles = static_cast<int>((span.size + kSelectionTile - 1) / kSelectionTile);
    table.push_back({span.offset, span.size, output_capacity_, static_cast<int>(tile_layers.size()), tiles});
    output_offsets_.push_back(output_capacity_);
    output_capacity_ += selection_cap(static_cast<int64_t>(selected_entries(span.size, max_density)));
    tile_layers.insert(tile_layers.end(), tiles, static_cast<int>(l));
  }
  tiles_ = static_cast<int>(tile_layers.size());
  FUSEKIT_CUDA_CHECK(cudaMalloc(&layer_table_, table.size() * sizeof(LayerDescriptor)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&states_, layers_.size() * sizeof(ThresholdSearch)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&tile_layers_, tile_layers.size() * sizeof(int)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&tile_counts_, tile_layers.size() * kSelectionCandidates * sizeof(unsigned)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&tile_offsets_, tile_layers.size() * sizeof(unsigned)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&indices_, std::max<int64_t>(output_capacity_, 1) * sizeof(int32_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&values_, std::max<int64_t>(output_capacity_, 1) * sizeof(float)));
  FUSEKIT_CUDA_CHECK(cudaMemset(states_, 0, layers_.size() * sizeof(ThresholdSearch)));
  FUSEKIT_CUDA_CHECK(
      cudaMemcpy(layer_table_, table.data(), table.size() * sizeof(LayerDescriptor), cudaMemcpyHostToDevice));
  FUSEKIT_CUDA_CHECK(
      cudaMemcpy(tile_layers_, tile_layers.data(), tile_layers.size() * sizeof(int), cudaMemcpyHostToDevice));
  // Those copies and the zeroing ran on the legacy default stream, which a non-blocking stream does
  // not wait for (and a copy from pageable memory may return before its data has landed).
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

TopkSelection::~TopkSelection() {
  cudaFree(layer_table_);
  cudaFree(states_);
  cudaFree(tile_layers_);
  cudaFree(tile_counts_);
  cudaFree(tile_offsets_);
  cudaFree(indices_);
  cudaFree(values_);
}

void TopkSelection::select(const void* gradient, kernels::DType dtype, float* residual, double density,
                           cudaStream_t stream, const float* second_moment, float eps) {
  if (!(density > 0 && density <= max_density_))
    throw std::invalid_argument("top-k selection: density " + std::to_string(density) + " outside (0, " +
                                std::to_string(max_density_) + "]");
  if (second_moment != nullptr && !(eps > 0 && std::isfinite(eps)))
    throw std::invalid_argument("top-k selection: ranking by the step needs eps > 0, not " + std::to_string(eps));
  const auto* layers = static_cast<const LayerDescriptor*>(layer_table_);
  auto* states = static_cast<ThresholdSearch*>(states_);
  const int layer_count = static_cast<int>(layers_.size());
  const bool aligned = kernels::aligned16(gradient) && kernels::aligned16(residual);
  const int decide_blocks = kernels::ceil_div(layer_count, kThreads);
  const auto run = [&](auto scored) {
    constexpr bool kScored = decltype(scored)::value;
    kernels::dispatch_dtype(dtype, "top-k selection", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = static_cast<const T*>(gradient);
      selection_sample_kernel<T, kScored>
          <<<layer_count, kSampleThreads, 0, stream>>>(g, residual, second_moment, eps, layers, states, density);
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
      selection_count_kernel<T, true, kScored><<<tiles_, kThreads, 0, stream>>>(
          g, residual, second_moment, eps, layers, tile_layers_, states, tile_counts_, aligned);
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
    });
    selection_decide_kernel<<<decide_blocks, kThreads, 0, stream>>>(states, layer_count, 0, kSelectionPasses == 1);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    for (int pass = 1; pass < kSelectionPasses; ++pass) {
      selection_count_kernel<float, false, kScored><<<tiles_, kThreads, 0, stream>>>(
          nullptr, residual, second_moment, eps, layers, tile_layers_, states, tile_counts_, aligned);
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
      selection_decide_kernel<<<decide_blocks, kThreads, 0, stream>>>(states, layer_count, pass,
                                                                      pass == kSelectionPasses - 1);
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
    }
    selection_scan_kernel<<<layer_count, kThreads, 0, stream>>>(layers, states, tile_counts_, tile_offsets_);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    selection_compact_kernel<kScored><<<tiles_, kThreads, 0, stream>>>(
        residual, second_moment, eps, layers, tile_layers_, states, tile_offsets_, indices_, values_, aligned);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  };
  if (second_moment != nullptr) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

std::vector<LayerSelectionResult> TopkSelection::results(cudaStream_t stream) const {
  std::vector<ThresholdSearch> states(layers_.size());
  FUSEKIT_CUDA_CHECK(
      cudaMemcpyAsync(states.data(), states_, states.size() * sizeof(ThresholdSearch), cudaMemcpyDeviceToHost, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<LayerSelectionResult> out;
  for (size_t l = 0; l < states.size(); ++l) {
    LayerSelectionResult result;
    result.k = states[l].k;
    result.count = states[l].count;
    const uint32_t bits = states[l].threshold_bits;
    float threshold;
    std::memcpy(&threshold, &bits, sizeof threshold);
    result.threshold = bits == kThresholdNothing ? INFINITY : threshold;
    result.passes = states[l].passes;
    result.output_offset = output_offsets_[l];
    out.push_back(result);
  }
  return out;
}

}  // namespace fusekit::dp
