// Error feedback around the top-k selection (see error_feedback.h for the math and the layouts).
//
// Design. A step is: (momentum only) u = m u + g over the flat buffer, one pass; the selection,
// which performs v += (g or u), picks per layer and zeroes the picked entries of v
// (topk_selection.h); then one pack kernel, a thread per entry, that finds its layer by a binary
// search over the layers' first packed positions, writes the flat index and the 16-bit value,
// puts the rounding remainder back into v and (momentum) clears u there.
#include "dp/error_feedback.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dp/detail/wire.cuh"
#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"

namespace fusekit::dp {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1u << 20;

struct PackLayer {
  int64_t offset;  // the layer's first element in the flat buffer
  int64_t source;  // its first entry in the selection's outputs
  int64_t packed;  // its first entry in the packed outputs (the last row: the total)
};

unsigned blocks_for(uint64_t items) {
  return static_cast<unsigned>(std::clamp<uint64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// ---- CUDA kernels

// u = m u + g over [0, n).
template <class T>
__global__ void __launch_bounds__(kThreads)
    momentum_kernel(float* __restrict__ u, const T* __restrict__ g, float m, uint64_t n) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    u[i] = m * u[i] + kernels::to_float(g[i]);
  }
}

// A thread per entry: flat index, wire value, the remainder into v, u cleared (if any).
template <class W>
__global__ void __launch_bounds__(kThreads)
    pack_kernel(const PackLayer* __restrict__ layers, int layer_count, const int32_t* __restrict__ local_indices,
                const float* __restrict__ local_values, uint32_t* __restrict__ indices, uint16_t* __restrict__ values,
                float* __restrict__ v, float* __restrict__ u) {
  const int64_t total = layers[layer_count].packed;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int low = 0, high = layer_count - 1;  // the last layer whose first packed entry is <= e
    while (low < high) {
      const int mid = (low + high + 1) / 2;
      if (layers[mid].packed <= e)
        low = mid;
      else
        high = mid - 1;
    }
    const PackLayer layer = layers[low];
    const int64_t j = layer.source + (e - layer.packed);
    const int64_t i = layer.offset + local_indices[j];
    float x = local_values[j];
    if constexpr (std::is_same_v<W, __half>) {
      if (fabsf(x) > 65504.f) x = copysignf(65504.f, x);  // fp16's largest finite; NaN stays NaN
    }
    const uint16_t bits = detail::to_wire<W>(x);
    indices[e] = static_cast<uint32_t>(i);
    values[e] = bits;
    v[i] = local_values[j] - detail::from_wire<W>(bits);
    if (u != nullptr) u[i] = 0.f;
  }
}

// A thread per entry: where the exchanged sum is zero (re-selection dropped it, or it rounded or
// cancelled to zero), the entry's wire value goes back into v.
template <class W>
__global__ void __launch_bounds__(kThreads)
    return_unapplied_kernel(const uint32_t* __restrict__ indices, const uint16_t* __restrict__ values, uint64_t count,
                            const float* __restrict__ sum, float* __restrict__ v, float* __restrict__ u) {
  for (uint64_t e = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t i = indices[e];
    if (sum[i] == 0.f) {
      v[i] += detail::from_wire<W>(values[e]);
    } else if (u != nullptr) {
      u[i] = 0.f;  // momentum factor masking, deferred to here: only where the entry was applied
    }
  }
}

}  // namespace

// ---- kernel launchers

void ErrorFeedback::return_unapplied(const float* sum, cudaStream_t stream) {
  if (count_ == 0) return;
  const kernels::DType wire = wire_ == WireValue::f16 ? kernels::DType::f16 : kernels::DType::bf16;
  kernels::dispatch_16bit_dtype(wire, "error feedback", [&](auto tag) {
    using W = typename decltype(tag)::type;
    return_unapplied_kernel<W><<<blocks_for(count_), kThreads, 0, stream>>>(
        indices_, values_, count_, sum, residual_, masking_ == MomentumMasking::on_apply ? momentum_ : nullptr);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

ErrorFeedback::ErrorFeedback(std::vector<LayerSpan> layers, double max_density, double momentum, WireValue wire)
    : selection_(layers, max_density), layers_(std::move(layers)), momentum_factor_(momentum), wire_(wire) {
  if (!(momentum >= 0 && momentum < 1))
    throw std::invalid_argument("error feedback: momentum must be in [0, 1), got " + std::to_string(momentum));
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (l > 0 && layers_[l].offset < layers_[l - 1].offset + layers_[l - 1].size)
      throw std::invalid_argument("error feedback: layer " + std::to_string(l) + " starts at " +
                                  std::to_string(layers_[l].offset) + ", inside or before layer " +
                                  std::to_string(l - 1) + " (layers in increasing offset order, not overlapping)");
    elements_ = static_cast<uint64_t>(layers_[l].offset + layers_[l].size);
  }
  if (elements_ >= (uint64_t{1} << 32))
    throw std::invalid_argument("error feedback: " + std::to_string(elements_) + " elements do not fit uint32 indices");
  const uint64_t capacity = std::max<uint64_t>(this->capacity(), 1);
  FUSEKIT_CUDA_CHECK(cudaMalloc(&residual_, elements_ * sizeof(float)));
  FUSEKIT_CUDA_CHECK(cudaMemset(residual_, 0, elements_ * sizeof(float)));
  if (momentum > 0) {
    FUSEKIT_CUDA_CHECK(cudaMalloc(&momentum_, elements_ * sizeof(float)));
    FUSEKIT_CUDA_CHECK(cudaMemset(momentum_, 0, elements_ * sizeof(float)));
  }
  FUSEKIT_CUDA_CHECK(cudaMalloc(&indices_, capacity * sizeof(uint32_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&values_, capacity * sizeof(uint16_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&pack_table_, (layers_.size() + 1) * sizeof(PackLayer)));
  // The zeroing above runs on the legacy default stream, which a non-blocking stream does not wait for.
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

ErrorFeedback::~ErrorFeedback() {
  cudaFree(residual_);
  cudaFree(momentum_);
  cudaFree(indices_);
  cudaFree(values_);
  cudaFree(pack_table_);
}

uint64_t ErrorFeedback::step(const void* gradient, kernels::DType dtype, double density, cudaStream_t stream,
                             const float* second_moment, float eps) {
  if (momentum_ != nullptr) {
    kernels::dispatch_dtype(dtype, "error feedback", [&](auto tag) {
      using T = typename decltype(tag)::type;
      momentum_kernel<T><<<blocks_for(elements_), kThreads, 0, stream>>>(
          momentum_, static_cast<const T*>(gradient), static_cast<float>(momentum_factor_), elements_);
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    selection_.select(momentum_, kernels::DType::f32, residual_, density, stream, second_moment, eps);
  } else {
    selection_.select(gradient, dtype, residual_, density, stream, second_moment, eps);
  }
  results_ = selection_.results(stream);  // synchronizes

  std::vector<PackLayer> table;
  int64_t packed = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    table.push_back({layers_[l].offset, results_[l].output_offset, packed});
    packed += results_[l].count;
  }
  table.push_back({0, 0, packed});
  FUSEKIT_CUDA_CHECK(
      cudaMemcpyAsync(pack_table_, table.data(), table.size() * sizeof(PackLayer), cudaMemcpyHostToDevice, stream));
  count_ = static_cast<uint64_t>(packed);
  if (packed == 0) return 0;
  const kernels::DType wire = wire_ == WireValue::f16 ? kernels::DType::f16 : kernels::DType::bf16;
  kernels::dispatch_16bit_dtype(wire, "error feedback", [&](auto tag) {
    using W = typename decltype(tag)::type;
    pack_kernel<W><<<blocks_for(count_), kThreads, 0, stream>>>(
        static_cast<const PackLayer*>(pack_table_), static_cast<int>(layers_.size()), selection_.indices(),
        selection_.values(), indices_, values_, residual_, masking_ == MomentumMasking::on_send ? momentum_ : nullptr);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  return count_;
}

}  // namespace fusekit::dp
