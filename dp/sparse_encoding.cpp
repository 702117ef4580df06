// Sparse encodings of a layer's selected entries (see sparse_encoding.h for the forms and layout).
#include "dp/sparse_encoding.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fusekit::dp {
namespace {

uint32_t float_bits(float value) { return std::bit_cast<uint32_t>(value); }

void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v));
  out.push_back(static_cast<uint8_t>(v >> 8));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The largest LEB128 size of k gaps whose sum is at most n - k: every gap takes one byte, then the
// cheapest extra bytes first (a second byte costs a gap of 128, a third 16384 - 128 more, ...).
uint64_t delta_varint_index_bound(uint64_t n, uint64_t k) {
  if (k == 0) return 0;
  uint64_t budget = n - k, total = k, at_level = k, previous = 0, value = 128;
  for (int level = 2; level <= 5; ++level) {
    const uint64_t step = value - previous;
    const uint64_t raised = std::min(at_level, budget / step);
    total += raised;
    budget -= raised * step;
    at_level = raised;
    previous = value;
    value *= 128;
  }
  return total;
}

void check_selection(uint64_t n, std::span<const uint32_t> indices) {
  if (n > UINT32_MAX)
    throw std::invalid_argument("sparse encoding: a layer of " + std::to_string(n) +
                                " elements: at most 2^32 - 1 are supported");
  if (indices.size() > n)
    throw std::invalid_argument("sparse encoding: " + std::to_string(indices.size()) + " indices in a layer of " +
                                std::to_string(n));
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= n || (i > 0 && indices[i] <= indices[i - 1]))
      throw std::invalid_argument("sparse encoding: index " + std::to_string(indices[i]) + " at position " +
                                  std::to_string(i) + " is not strictly increasing below n = " + std::to_string(n));
  }
}

[[noreturn]] void corrupt(size_t record, size_t at, const std::string& what) {
  throw std::runtime_error("sparse buffer: record " + std::to_string(record) + " at byte " + std::to_string(at) + ": " +
                           what);
}

}  // namespace

const char* encoding_name(Encoding form) {
  switch (form) {
    case Encoding::key_value:
      return "key_value";
    case Encoding::bitmap:
      return "bitmap";
    case Encoding::delta_varint:
      return "delta_varint";
  }
  return "unknown";
}

const char* wire_value_name(WireValue type) { return type == WireValue::f16 ? "fp16" : "bf16"; }

uint16_t float_to_half_bits(float value) {
  const uint32_t x = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((magnitude >> 13) & 0x3FFu);  // NaN
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to infinity
  if (magnitude <= 0x33000000u) return sign;            // 2^-25 and below round to zero (2^-25 ties to even 0)
  uint32_t result, rest, half;
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a subnormal half, in units of 2^-24.
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 to 24
    result = mantissa >> shift;
    rest = mantissa & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {
    const uint32_t rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
    result = rebiased >> 13;
    rest = rebiased & 0x1FFFu;
    half = 0x1000u;
  }
  if (rest > half || (rest == half && (result & 1u))) ++result;  // a carry moves into the exponent, as it should
  return sign | static_cast<uint16_t>(result);
}

uint16_t float_to_bfloat16_bits(float value) {
  const uint32_t x = float_bits(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN stays NaN
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return std::bit_cast<float>(sign | float_bits(magnitude));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

float bfloat16_bits_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_wire(float value, WireValue type) {
  return type == WireValue::f16 ? float_to_half_bits(value) : float_to_bfloat16_bits(value);
}
float wire_to_float(uint16_t bits, WireValue type) {
  return type == WireValue::f16 ? half_bits_to_float(bits) : bfloat16_bits_to_float(bits);
}

size_t varint_bytes(uint32_t value) {
  size_t bytes = 1;
  while (value >= 128) {
    value >>= 7;
    ++bytes;
  }
  return bytes;
}

size_t payload_bytes_bound(Encoding form, uint64_t n, uint64_t k) {
  if (k > n) throw std::invalid_argument("sparse encoding: k = " + std::to_string(k) + " > n = " + std::to_string(n));
  switch (form) {
    case Encoding::key_value:
      return k * (4 + kWireValueBytes);
    case Encoding::bitmap:
      return ceil_div(n, 8) + k * kWireValueBytes;
    case Encoding::delta_varint:
      return delta_varint_index_bound(n, k) + k * kWireValueBytes;
  }
  throw std::invalid_argument("sparse encoding: unknown form");
}

size_t payload_bytes(Encoding form, uint64_t n, std::span<const uint32_t> indices) {
  if (form != Encoding::delta_varint) return payload_bytes_bound(form, n, indices.size());
  size_t bytes = indices.size() * kWireValueBytes;
  for (size_t i = 0; i < indices.size(); ++i)
    bytes += varint_bytes(i == 0 ? indices[0] : indices[i] - indices[i - 1] - 1);
  return bytes;
}

Encoding choose_encoding(uint64_t n, uint64_t k) {
  Encoding best = Encoding::key_value;
  for (Encoding form : {Encoding::bitmap, Encoding::delta_varint}) {
    if (payload_bytes_bound(form, n, k) < payload_bytes_bound(best, n, k)) best = form;
  }
  return best;
}

size_t append_layer(std::vector<uint8_t>& buffer, Encoding form, WireValue type, uint64_t n,
                    std::span<const uint32_t> indices, std::span<const float> values) {
  check_selection(n, indices);
  if (values.size() != indices.size())
    throw std::invalid_argument("sparse encoding: " + std::to_string(indices.size()) + " indices but " +
                                std::to_string(values.size()) + " values");
  if (form != Encoding::key_value && form != Encoding::bitmap && form != Encoding::delta_varint)
    throw std::invalid_argument("sparse encoding: unknown form");
  const size_t payload = payload_bytes(form, n, indices);
  const size_t start = buffer.size();
  buffer.reserve(start + kLayerHeaderBytes + payload);
  buffer.push_back(static_cast<uint8_t>(form));
  buffer.push_back(static_cast<uint8_t>(type));
  put_u16(buffer, 0);
  put_u32(buffer, static_cast<uint32_t>(n));
  put_u32(buffer, static_cast<uint32_t>(indices.size()));
  put_u32(buffer, static_cast<uint32_t>(payload));
  switch (form) {
    case Encoding::key_value:
      for (uint32_t index : indices) put_u32(buffer, index);
      break;
    case Encoding::bitmap: {
      const size_t bitmap_start = buffer.size();
      buffer.resize(bitmap_start + ceil_div(n, 8), 0);
      for (uint32_t index : indices) buffer[bitmap_start + index / 8] |= static_cast<uint8_t>(1u << (index % 8));
      break;
    }
    case Encoding::delta_varint:
      for (size_t i = 0; i < indices.size(); ++i) {
        uint32_t gap = i == 0 ? indices[0] : indices[i] - indices[i - 1] - 1;
        while (gap >= 128) {
          buffer.push_back(static_cast<uint8_t>(0x80u | (gap & 0x7Fu)));
          gap >>= 7;
        }
        buffer.push_back(static_cast<uint8_t>(gap));
      }
      break;
  }
  for (float value : values) put_u16(buffer, float_to_wire(value, type));
  return buffer.size() - start;
}

std::vector<DecodedLayer> decode_layers(std::span<const uint8_t> buffer) {
  std::vector<DecodedLayer> layers;
  size_t at = 0;
  while (at < buffer.size()) {
    const size_t record = layers.size();
    const size_t left = buffer.size() - at;
    if (left < kLayerHeaderBytes)
      corrupt(record, at,
              "truncated header: " + std::to_string(left) + " of " + std::to_string(kLayerHeaderBytes) + " bytes");
    const uint8_t* header = buffer.data() + at;
    if (header[0] > static_cast<uint8_t>(Encoding::delta_varint))
      corrupt(record, at, "unknown form " + std::to_string(header[0]));
    if (header[1] > static_cast<uint8_t>(WireValue::bf16))
      corrupt(record, at, "unknown value type " + std::to_string(header[1]));
    if (get_u16(header + 2) != 0) corrupt(record, at, "reserved header bytes are not zero");
    DecodedLayer layer{
        static_cast<Encoding>(header[0]), static_cast<WireValue>(header[1]), get_u32(header + 4), {}, {}, 0};
    const uint32_t k = get_u32(header + 8);
    const uint64_t payload = get_u32(header + 12);
    if (k > layer.n) corrupt(record, at, "k = " + std::to_string(k) + " exceeds n = " + std::to_string(layer.n));
    if (payload > left - kLayerHeaderBytes)
      corrupt(record, at,
              "truncated payload: " + std::to_string(left - kLayerHeaderBytes) + " of " + std::to_string(payload) +
                  " bytes");
    const uint64_t value_bytes = uint64_t{k} * kWireValueBytes;
    if (payload < value_bytes) corrupt(record, at, "payload of " + std::to_string(payload) + " bytes is too short");
    const uint64_t index_bytes = payload - value_bytes;
    const uint8_t* p = header + kLayerHeaderBytes;
    layer.indices.reserve(k);
    switch (layer.form) {
      case Encoding::key_value:
        if (index_bytes != uint64_t{k} * 4)
          corrupt(record, at,
                  "key_value payload of " + std::to_string(payload) + " bytes for k = " + std::to_string(k));
        for (uint32_t i = 0; i < k; ++i) {
          const uint32_t index = get_u32(p + 4 * size_t{i});
          if (index >= layer.n || (i > 0 && index <= layer.indices.back()))
            corrupt(record, at, "index " + std::to_string(index) + " is not strictly increasing below n");
          layer.indices.push_back(index);
        }
        break;
      case Encoding::bitmap: {
        if (index_bytes != ceil_div(layer.n, 8))
          corrupt(record, at,
                  "bitmap payload of " + std::to_string(payload) + " bytes for n = " + std::to_string(layer.n) +
                      ", k = " + std::to_string(k));
        for (uint64_t byte = 0; byte < index_bytes; ++byte) {
          for (uint32_t bit = 0; bit < 8; ++bit) {
            if (!((p[byte] >> bit) & 1u)) continue;
            const uint64_t index = byte * 8 + bit;
            if (index >= layer.n) corrupt(record, at, "bitmap bit set past n");
            if (layer.indices.size() == k)
              corrupt(record, at, "bitmap holds more than k = " + std::to_string(k) + " bits");
            layer.indices.push_back(static_cast<uint32_t>(index));
          }
        }
        if (layer.indices.size() != k)
          corrupt(record, at,
                  "bitmap holds " + std::to_string(layer.indices.size()) + " bits, k = " + std::to_string(k));
        break;
      }
      case Encoding::delta_varint: {
        uint64_t pos = 0, next = 0;  // next: the smallest index the next entry may take
        for (uint32_t i = 0; i < k; ++i) {
          uint64_t gap = 0;
          for (int shift = 0;; shift += 7) {
            if (pos == index_bytes) corrupt(record, at, "varint runs past the index bytes");
            const uint8_t byte = p[pos++];
            if (shift == 28 && byte > 0x0F) corrupt(record, at, "varint longer than 32 bits");
            gap |= uint64_t{byte & 0x7Fu} << shift;
            if (!(byte & 0x80u)) break;
          }
          const uint64_t index = next + gap;
          if (index >= layer.n) corrupt(record, at, "index " + std::to_string(index) + " not below n");
          layer.indices.push_back(static_cast<uint32_t>(index));
          next = index + 1;
        }
        if (pos != index_bytes)
          corrupt(record, at,
                  "varints end at " + std::to_string(pos) + " of " + std::to_string(index_bytes) + " index bytes");
        break;
      }
    }
    const uint8_t* values = p + index_bytes;
    layer.values.reserve(k);
    for (uint32_t i = 0; i < k; ++i) layer.values.push_back(wire_to_float(get_u16(values + 2 * size_t{i}), layer.type));
    layer.record_bytes = kLayerHeaderBytes + payload;
    at += layer.record_bytes;
    layers.push_back(std::move(layer));
  }
  return layers;
}

}  // namespace fusekit::dp
