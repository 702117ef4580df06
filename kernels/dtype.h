// Storage types of fusekit's operators. Arithmetic is always in float registers; tensors are
// stored as float, half or bfloat16.
#pragma once

#include <cstddef>

namespace fusekit::kernels {

enum class DType { f32, f16, bf16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "fp32", "fp16", "bf16"

}  // namespace fusekit::kernels
