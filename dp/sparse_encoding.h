// Sparse encodings of one layer's selected gradient entries, for the wire: the host encoder and
// decoder (the reference for GPU encoders), exact byte counts, and the choice between the forms.
//
// A layer of n elements sends k (index, value) pairs, indices strictly increasing in [0, n), values
// rounded to fp16 or bf16 (round to nearest even). Three forms of the index part:
//   key_value:    k little-endian uint32 indices                       4k bytes
//   bitmap:       ceil(n / 8) bytes, bit i of byte i / 8 (LSB first)   ceil(n / 8) bytes
//   delta_varint: LEB128 of the gaps, index[0] then                     between k and 5k bytes
//                 index[i] - index[i - 1] - 1 (0 for neighbours)
// each followed by the k values as little-endian 16-bit words in index order.
//
// A record is a 16-byte header (form u8, value type u8, two zero bytes, n u32, k u32, payload
// bytes u32, all little-endian) and its payload; a buffer is records back to back, byte-packed (no
// padding: decoders read unaligned), so a receiver decodes a concatenation of layers.
//
// The non-obvious choice: choose_encoding(n, k) compares bounds known before encoding, so a sender
// can size its buffer before it sees the indices. key_value and bitmap sizes are exact; for
// delta_varint the bound is the largest size any k indices in [0, n) can take (gaps of exactly 128,
// 16384, ... where they fit), which some selection reaches; the encoded size is at most the bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dp/wire_value.h"

namespace fusekit::dp {

enum class Encoding : uint8_t { key_value = 0, bitmap = 1, delta_varint = 2 };

const char* encoding_name(Encoding form);     // "key_value", "bitmap", "delta_varint"
const char* wire_value_name(WireValue type);  // "fp16", "bf16"

// Host conversions, round to nearest even (NaN stays NaN, overflow becomes infinity).
uint16_t float_to_half_bits(float value);
uint16_t float_to_bfloat16_bits(float value);
float half_bits_to_float(uint16_t bits);
float bfloat16_bits_to_float(uint16_t bits);
uint16_t float_to_wire(float value, WireValue type);
float wire_to_float(uint16_t bits, WireValue type);

constexpr size_t kLayerHeaderBytes = 16;
constexpr size_t kWireValueBytes = 2;

// Bytes of one LEB128 varint of `value` (1 to 5).
size_t varint_bytes(uint32_t value);

// Payload bytes (no header) of k entries of a layer of n elements: exact for key_value and bitmap,
// the largest possible size for delta_varint (see the top of the file). Throws if k > n.
size_t payload_bytes_bound(Encoding form, uint64_t n, uint64_t k);
// The exact payload bytes of these indices in this form.
size_t payload_bytes(Encoding form, uint64_t n, std::span<const uint32_t> indices);
// The form with the smallest payload_bytes_bound; ties go to the simpler form (key_value, bitmap,
// delta_varint in that order).
Encoding choose_encoding(uint64_t n, uint64_t k);

// Appends one record to `buffer`; returns its bytes (header + payload). Throws std::invalid_argument
// if indices are not strictly increasing below n, the sizes differ, or n or k exceed 32 bits.
size_t append_layer(std::vector<uint8_t>& buffer, Encoding form, WireValue type, uint64_t n,
                    std::span<const uint32_t> indices, std::span<const float> values);

struct DecodedLayer {
  Encoding form;
  WireValue type;
  uint32_t n;
  std::vector<uint32_t> indices;
  std::vector<float> values;  // the 16-bit values, widened exactly
  size_t record_bytes;        // header + payload
};

// Decodes every record of the buffer. A truncated or corrupt buffer throws std::runtime_error
// saying which record, at which byte, and what is wrong; it never reads outside the buffer.
std::vector<DecodedLayer> decode_layers(std::span<const uint8_t> buffer);

}  // namespace fusekit::dp
