#include "models/storage_conversion.h"

#include <bit>
#include <cstring>

#include "models/bert_config.h"

namespace fusekit::models {

uint16_t float_to_half(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN, quiet
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {
    // A half subnormal (or zero): the value in units of 2^-24, rounded to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t exponent = abs >> 23;                        // biased, 102..112
    const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // value = mantissa * 2^(exponent - 150) = (mantissa >> shift) units
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a carry
  // into the exponent is the correct result (up to infinity, excluded above).
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  uint32_t x;
  if (exponent == 0x1F) {
    x = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    x = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    x = sign;
  } else {
    // Subnormal: mantissa * 2^-24, exactly representable in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(x);
}

uint16_t float_to_bfloat16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN, quiet
  // Round to nearest even on the low 16 bits; a carry moves into the exponent (to infinity at the top).
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float bfloat16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

namespace {

float load(kernels::DType type, const std::byte* p) {
  if (type == kernels::DType::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return type == kernels::DType::f16 ? half_to_float(bits) : bfloat16_to_float(bits);
}

void store(kernels::DType type, float value, std::byte* p) {
  if (type == kernels::DType::f32) {
    std::memcpy(p, &value, 4);
    return;
  }
  const uint16_t bits = type == kernels::DType::f16 ? float_to_half(value) : float_to_bfloat16(value);
  std::memcpy(p, &bits, 2);
}

}  // namespace

void convert_storage(kernels::DType from, const std::byte* source, kernels::DType to, std::byte* destination,
                     size_t count) {
  const size_t in = dtype_bytes(from), out = dtype_bytes(to);
  if (from == to) {
    std::memcpy(destination, source, count * in);
    return;
  }
  for (size_t i = 0; i < count; ++i) store(to, load(from, source + i * in), destination + i * out);
}

}  // namespace fusekit::models
