// Storage types of fusekit's operators. Arithmetic is always in float registers; tensors are
// stored as float, half or bfloat16.
#pragma once

#include <cstddef>

namespace fusekit::kernels {

enum class DType { f32, f16, bf16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "fp32", "fp16", "bf16"

}  // namespace fusekit::kernels

// In CUDA sources: maps the run-time dtype to the storage type T for the statements that follow.
#define FUSEKIT_DTYPE_SWITCH(dtype, ...)    \
  switch (dtype) {                          \
    case ::fusekit::kernels::DType::f32: {  \
      using T = float;                      \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    case ::fusekit::kernels::DType::f16: {  \
      using T = __half;                     \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
    case ::fusekit::kernels::DType::bf16: { \
      using T = __nv_bfloat16;              \
      __VA_ARGS__;                          \
      break;                                \
    }                                       \
  }
