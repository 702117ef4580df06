// Shared by the GPU tests against libtorch: dtype mapping and the relative error of a result
// against a float64 tensor (NaN never passes).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/dtype.h"

namespace fusekit {

inline at::ScalarType torch_type(kernels::DType dtype) {
  return dtype == kernels::DType::f32 ? at::kFloat : dtype == kernels::DType::f16 ? at::kHalf : at::kBFloat16;
}

inline double relative_error(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor o = out.to(at::kDouble);
  if (!at::isfinite(o).all().item<bool>()) return INFINITY;  // NaN never passes
  const double norm = ref.norm().item<double>();
  const double diff = (o - ref).norm().item<double>();
  return norm > 0 ? diff / norm : diff;
}

// The fused result may be at most twice as far from the float64 result `ref` as PyTorch eager's
// own result in the same dtype (the FlashAttention rule), or `floor` where that is larger.
inline void expect_within_twice_eager(const char* name, const at::Tensor& fused, const at::Tensor& eager,
                                      const at::Tensor& ref, double floor) {
  const double fused_error = relative_error(fused, ref);
  const double eager_error = relative_error(eager, ref);
  EXPECT_LE(fused_error, std::max(2 * eager_error, floor))
      << name << ": fused " << fused_error << ", PyTorch eager " << eager_error;
}

}  // namespace fusekit
