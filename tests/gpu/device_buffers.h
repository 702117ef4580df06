// Shared by the GPU tests of the operators: device buffers filled from doubles (rounded to the
// storage type, the host copy updated to what was stored) or poisoned with NaN, downloads back to
// doubles, and DESIGN.md's relative-error bounds.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::kernels {

#define CHECK_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// DESIGN.md's bounds on ||out - ref|| / ||ref||.
inline double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 2e-3 : 1e-2; }

// Host-side rounding to the storage type and back, and the raw bits of the stored value.
inline std::vector<uint16_t> to_bits(const std::vector<double>& v, DType dtype) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::f16) {
      __half h = __float2half_rn(static_cast<float>(v[i]));
      out[i] = *reinterpret_cast<uint16_t*>(&h);
    } else {
      __nv_bfloat16 b = __float2bfloat16_rn(static_cast<float>(v[i]));
      out[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
  return out;
}
inline double from_bits(uint16_t bits, DType dtype) {
  if (dtype == DType::f16) return __half2float(*reinterpret_cast<__half*>(&bits));
  return __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&bits));
}

// A device buffer of `count` elements of `dtype`, filled from doubles (rounded to the dtype, and
// `values` updated to what was stored) or poisoned with NaN.
class Buffer {
 public:
  Buffer(size_t count, DType dtype) : count_(count), dtype_(dtype) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(1, count * dtype_size(dtype))), cudaSuccess);
    poison();
  }
  ~Buffer() { cudaFree(data_); }
  void poison() { cudaMemset(data_, 0xFF, count_ * dtype_size(dtype_)); }  // all-ones bits: NaN in every dtype
  void upload(std::vector<double>& values) {
    if (dtype_ == DType::f32) {
      std::vector<float> f(values.begin(), values.end());
      for (size_t i = 0; i < f.size(); ++i) values[i] = f[i];
      cudaMemcpy(data_, f.data(), f.size() * 4, cudaMemcpyHostToDevice);
    } else {
      std::vector<uint16_t> bits = to_bits(values, dtype_);
      for (size_t i = 0; i < bits.size(); ++i) values[i] = from_bits(bits[i], dtype_);
      cudaMemcpy(data_, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
    }
  }
  std::vector<double> download() const {
    std::vector<double> out(count_);
    if (dtype_ == DType::f32) {
      std::vector<float> f(count_);
      cudaMemcpy(f.data(), data_, count_ * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < count_; ++i) out[i] = f[i];
    } else {
      std::vector<uint16_t> bits(count_);
      cudaMemcpy(bits.data(), data_, count_ * 2, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < count_; ++i) out[i] = from_bits(bits[i], dtype_);
    }
    return out;
  }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t count_;
  DType dtype_;
};

inline std::vector<double> download_floats(const float* p, size_t n) {
  std::vector<float> f(n);
  cudaMemcpy(f.data(), p, n * 4, cudaMemcpyDeviceToHost);
  return std::vector<double>(f.begin(), f.end());
}

// ||out - ref|| / ||ref||; infinite if any output is NaN (an unwritten or broken element).
inline double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ||mean - ref_mean|| over the rows' root mean squares sqrt(ref_mean^2 + 1 / ref_rstd^2) (= mean^2 +
// variance + eps): the error of LayerNorm's per-row means against the scale of the rows' values,
// which is what float summation's error follows. Relative to the means themselves, a row whose mean
// is near 0 (one row of zero-mean random values) failed DESIGN.md's 1e-5 by chance (3.2e-5 once in
// embedding_layernorm_test at 1 x 768).
// Infinite if any mean is NaN.
inline double mean_error(const std::vector<double>& mean, const std::vector<double>& ref_mean,
                         const std::vector<double>& ref_rstd) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref_mean.size(); ++i) {
    if (!std::isfinite(mean[i])) return INFINITY;
    diff += (mean[i] - ref_mean[i]) * (mean[i] - ref_mean[i]);
    norm += ref_mean[i] * ref_mean[i] + 1.0 / (ref_rstd[i] * ref_rstd[i]);
  }
  return std::sqrt(diff / norm);
}

// The bound for an output stored in `dtype`: DESIGN.md's, or twice the error of the float64
// reference itself rounded to the storage type where that is larger (values in fp16's subnormal
// range, e.g. probabilities of rows of 24,000 keys, cannot be stored any closer).
inline double storage_tolerance(const std::vector<double>& ref, DType dtype) {
  if (dtype == DType::f32) return tolerance(dtype);
  const std::vector<uint16_t> bits = to_bits(ref, dtype);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;  // infinities and NaN are compared exactly elsewhere
    const double d = from_bits(bits[i], dtype) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  const double rounding = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return std::max(tolerance(dtype), 2 * rounding);
}

}  // namespace fusekit::kernels
