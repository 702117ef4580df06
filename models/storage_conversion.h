// Conversions between float and the 16-bit storage types on the host, for loading weights into a
// flat buffer of another type and reading results back. float -> half and float -> bfloat16 round
// to nearest even, as the CUDA intrinsics __float2half_rn and __float2bfloat16_rn do: overflow goes
// to infinity, values below the smallest subnormal round to signed zero, NaN stays NaN (quiet).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/dtype.h"

namespace fusekit::models {

uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);
uint16_t float_to_bfloat16(float value);
float bfloat16_to_float(uint16_t bits);

// Converts `count` elements from one storage type to another (little-endian bytes, any alignment).
// Equal types copy. f32 <-> f16 <-> bf16 goes through float: exact where the target holds the value.
void convert_storage(kernels::DType from, const std::byte* source, kernels::DType to, std::byte* destination,
                     size_t count);

}  // namespace fusekit::models
