// A layer-level op's parameters packed into one flat buffer (torch_ops/bert_layer.cpp,
// swin_block.cpp): each parameter, cast to the buffer's dtype, at its offset (in elements); and
// the gradients that come back in the same layout, unpacked into one fresh tensor per parameter
// in that parameter's own dtype and shape.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fusekit::torch_ops {

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
