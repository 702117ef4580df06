// Shared by the GPU tests against libtorch: dtype mapping and the relative error of a result
// against a float64 tensor (NaN never passes).
#pragma once

#include <ATen/ATen.h>

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

}  // namespace fusekit
