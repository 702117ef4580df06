// The one map from an operator's run-time DType to the storage type T of its kernel templates:
// dispatch_dtype(dtype, "layernorm", [&](auto type) { using T = typename decltype(type)::type; ... })
// calls the lambda once with TypeTag<float>, TypeTag<__half> or TypeTag<__nv_bfloat16>. Operators
// whose kernels exist only for 16-bit types use dispatch_16bit_dtype, which refuses fp32 with a
// message naming the operator.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/dtype.h"

namespace fusekit::kernels {

template <class T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) for the storage type T of `dtype` and returns its result; throws
// std::invalid_argument naming `op` for a value outside DType.
template <class Fn>
decltype(auto) dispatch_dtype(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(TypeTag<float>{});
    case DType::f16:
      return fn(TypeTag<__half>{});
    case DType::bf16:
      return fn(TypeTag<__nv_bfloat16>{});
  }
  throw std::invalid_argument(std::string(op) + ": unknown dtype");
}

// As dispatch_dtype for kernels that exist only for fp16 and bf16: fp32 throws
// std::invalid_argument("<op>: dtype fp32 is not supported (fp16, bf16)").
template <class Fn>
decltype(auto) dispatch_16bit_dtype(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f16:
      return fn(TypeTag<__half>{});
    case DType::bf16:
      return fn(TypeTag<__nv_bfloat16>{});
    case DType::f32:
      break;
  }
  throw std::invalid_argument(std::string(op) + ": dtype " + dtype_name(dtype) + " is not supported (fp16, bf16)");
}

}  // namespace fusekit::kernels
