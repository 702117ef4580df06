// A layer-level op's parameters packed into one flat buffer (torch_ops/bert_layer.cpp,
// swin_block.cpp): each parameter, cast to the buffer's dtype, at its offset (in elements); and
// the gradients that come back in the same layout, unpacked into one fresh tensor per parameter
// in that parameter's own dtype and shape.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {

// Each of params is a contiguous floating CUDA tensor on x's device with the shape at its index in
// `shapes`; a failure names params[k] and, from sizes() (called only then), the layer's sizes.
template <typename Sizes>
void check_params(at::TensorList params, const std::vector<std::vector<int64_t>>& shapes, const at::Tensor& x,
                  const char* op, Sizes&& sizes) {
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    const std::string name = "params[" + std::to_string(k) + "]";
    check_cuda(p, op, name.c_str());
    dtype_of(p, op, name.c_str());
    TORCH_CHECK_VALUE(p.device() == x.device(),
                      text("fusekit::", op, ": ", name, " is on ", p.device(), " but x on ", x.device()));
    TORCH_CHECK_VALUE(p.sizes() == c10::IntArrayRef(shapes[k]),
                      text("fusekit::", op, ": ", name, " has shape ", p.sizes(), ", expected ",
                           c10::IntArrayRef(shapes[k]), " (", sizes(), ")"));
  }
}

// The address of element `elements` of a flat tensor.
inline void* element_at(const at::Tensor& flat, int64_t elements) {
  return static_cast<char*>(flat.data_ptr()) + elements * static_cast<int64_t>(flat.element_size());
}

// param, cast to flat's dtype, into flat[offset, offset + numel).
inline void pack_into(const at::Tensor& flat, int64_t offset, const at::Tensor& param) {
  flat.narrow(0, offset, param.numel()).view(param.sizes()).copy_(param);
}

// flat[offset, offset + numel) as a new tensor of param's dtype and shape (never a view of flat:
// an op's outputs must not alias one another).
inline at::Tensor unpack_as(const at::Tensor& flat, int64_t offset, const at::Tensor& param) {
  return flat.narrow(0, offset, param.numel())
      .view(param.sizes())
      .to(param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace fusekit::torch_ops
