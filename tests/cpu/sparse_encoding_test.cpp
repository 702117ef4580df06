// The sparse encodings: 16-bit conversions against CUDA's host conversions, round trips of every
// form on random, clustered, empty and full layers, byte counts against encoded sizes, the
// delta-varint bound reached, and truncated or corrupt buffers rejected with an error.
#include "dp/sparse_encoding.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace fusekit::dp {
namespace {

constexpr Encoding kForms[] = {Encoding::key_value, Encoding::bitmap, Encoding::delta_varint};

uint16_t cuda_half_bits(float v) {
  __half h = __float2half_rn(v);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
uint16_t cuda_bfloat16_bits(float v) {
  __nv_bfloat16 b = __float2bfloat16_rn(v);
  uint16_t bits;
  std::memcpy(&bits, &b, 2);
  return bits;
}

TEST(WireValues, RoundToNearestEvenAsCuda) {
  std::mt19937 rng(1);
  std::vector<float> samples = {0.f,
                                -0.f,
                                1.f,
                                -1.f,
                                65504.f,
                                65519.f,
                                65520.f,
                                1e10f,
                                5.96e-8f,
                                2.98e-8f,
                                2.9802322e-8f,
                                6.1e-5f,
                                6.103515625e-05f,
                                1.0009765625f,
                                1.00048828125f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 200000; ++i) samples.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (int i = 0; i < 100000; ++i)
    samples.push_back(std::ldexp(static_cast<float>(rng() % 4096) / 4096.f, -30 + static_cast<int>(rng() % 50)));
  int checked = 0;
  for (float v : samples) {
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(v))));
      EXPECT_TRUE(std::isnan(bfloat16_bits_to_float(float_to_bfloat16_bits(v))));
      continue;
    }
    ASSERT_EQ(float_to_half_bits(v), cuda_half_bits(v)) << v;
    ASSERT_EQ(float_to_bfloat16_bits(v), cuda_bfloat16_bits(v)) << v;
    ++checked;
  }
  EXPECT_GT(checked, 250000);
  for (uint32_t bits = 0; bits < 65536; ++bits) {  // every half widens exactly and narrows back
    const float f = half_bits_to_float(static_cast<uint16_t>(bits));
    __half_raw raw;
    raw.x = static_cast<unsigned short>(bits);
    const float cuda = __half2float(__half(raw));
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(f));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(cuda)) << bits;
      ASSERT_EQ(float_to_half_bits(f), bits);
    }
  }
}

struct Selection {
  uint64_t n;
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

Selection random_selection(uint64_t n, uint64_t k, std::mt19937& rng) {
  Selection s{n, {}, {}};
  std::vector<uint32_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = static_cast<uint32_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  s.indices.assign(all.begin(), all.begin() + k);
  std::sort(s.indices.begin(), s.indices.end());
  std::normal_distribution<float> normal(0.f, 1e-3f);
  for (uint64_t i = 0; i < k; ++i) s.values.push_back(normal(rng));
  return s;
}

// Encodes, checks the byte counts, decodes and compares.
void round_trip(const Selection& s, Encoding form, WireValue type) {
  std::vector<uint8_t> buffer;
  const size_t bytes = append_layer(buffer, form, type, s.n, s.indices, s.values);
  const size_t payload = payload_bytes(form, s.n, s.indices);
  ASSERT_EQ(bytes, buffer.size());
  ASSERT_EQ(bytes, kLayerHeaderBytes + payload) << encoding_name(form);
  ASSERT_LE(payload, payload_bytes_bound(form, s.n, s.indices.size()));
  if (form != Encoding::delta_varint) {
    ASSERT_EQ(payload, payload_bytes_bound(form, s.n, s.indices.size()));
  }
  const std::vector<DecodedLayer> layers = decode_layers(buffer);
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].form, form);
  EXPECT_EQ(layers[0].type, type);
  EXPECT_EQ(layers[0].n, s.n);
  EXPECT_EQ(layers[0].record_bytes, bytes);
  ASSERT_EQ(layers[0].indices, s.indices) << encoding_name(form) << " n=" << s.n;
  ASSERT_EQ(layers[0].values.size(), s.values.size());
  for (size_t i = 0; i < s.values.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(layers[0].values[i]),
              std::bit_cast<uint32_t>(wire_to_float(float_to_wire(s.values[i], type), type)));
}

TEST(SparseEncoding, RoundTripsRandomClusteredEmptyFull) {
  std::mt19937 rng(2);
  std::vector<Selection> cases;
  for (uint64_t n : {1, 7, 8, 9, 1000, 4097, 100003}) {
    for (double d : {0.0, 0.001, 0.01, 0.1, 0.5, 1.0}) {
      cases.push_back(random_selection(n, static_cast<uint64_t>(std::round(d * n)), rng));
    }
    // Clustered: every index in one run in the middle.
    Selection c{n, {}, {}};
    for (uint64_t i = n / 3; i < std::min<uint64_t>(n, n / 3 + 1 + n / 10); ++i) {
      c.indices.push_back(static_cast<uint32_t>(i));
      c.values.push_back(static_cast<float>(i) * 0.25f);
    }
    cases.push_back(c);
  }
  // Very large gaps: the first and last index of a layer of 2^32 - 1 elements, and one in between.
  cases.push_back({UINT32_MAX, {0, 1u << 28, UINT32_MAX - 1}, {1.f, -2.f, 3.f}});
  cases.push_back({UINT32_MAX, {UINT32_MAX - 1}, {0.5f}});
  for (const Selection& s : cases)
    for (Encoding form : kForms) {
      if (form == Encoding::bitmap && s.n > (1u << 24)) continue;  // a 512 MiB bitmap: not worth the test's time
      for (WireValue type : {WireValue::f16, WireValue::bf16}) round_trip(s, form, type);
    }
}

TEST(SparseEncoding, ConcatenatedLayersDecodeInOrder) {
  std::mt19937 rng(3);
  std::vector<uint8_t> buffer;
  std::vector<Selection> layers;
  for (int i = 0; i < 12; ++i) {
    const uint64_t n = 1 + rng() % 5000;
    layers.push_back(random_selection(n, rng() % (n + 1), rng));
    append_layer(buffer, kForms[i % 3], i % 2 ? WireValue::bf16 : WireValue::f16, n, layers.back().indices,
                 layers.back().values);
  }
  const auto decoded = decode_layers(buffer);
  ASSERT_EQ(decoded.size(), layers.size());
  size_t total = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_EQ(decoded[i].indices, layers[i].indices);
    EXPECT_EQ(decoded[i].form, kForms[i % 3]);
    total += decoded[i].record_bytes;
  }
  EXPECT_EQ(total, buffer.size());
}

TEST(SparseEncoding, ChooseEncodingIsTheSmallestBound) {
  for (uint64_t n : {1ull, 100ull, 4096ull, 1000000ull, 110000000ull}) {
    for (double d : {0.0, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.5, 1.0}) {
      const uint64_t k = static_cast<uint64_t>(d * n);
      const Encoding chosen = choose_encoding(n, k);
      for (Encoding form : kForms) EXPECT_LE(payload_bytes_bound(chosen, n, k), payload_bytes_bound(form, n, k));
    }
  }
  EXPECT_EQ(choose_encoding(1000000, 0), Encoding::key_value);  // ties go to the simplest
  EXPECT_EQ(choose_encoding(1000000, 500000), Encoding::bitmap);
  EXPECT_EQ(choose_encoding(1000000, 10000), Encoding::delta_varint);
  EXPECT_EQ(choose_encoding(UINT32_MAX, 1), Encoding::key_value);  // one gap of 2^32 - 2 takes 5 bytes
  EXPECT_EQ(payload_bytes_bound(Encoding::bitmap, 9, 2), 2u + 4u);
  EXPECT_EQ(payload_bytes_bound(Encoding::key_value, 9, 2), 12u);
  EXPECT_THROW(payload_bytes_bound(Encoding::key_value, 3, 4), std::invalid_argument);
}

// The delta-varint bound is reached: gaps of 128^(L-1) as the bound's greedy fill assigns them.
TEST(SparseEncoding, DeltaVarintBoundIsReached) {
  for (uint64_t n : {1000ull, 20000ull, 3000000ull}) {
    for (uint64_t k : {1ull, 3ull, 100ull, 900ull}) {
      if (k > n) continue;
      std::vector<uint64_t> gaps(k, 0);
      uint64_t budget = n - k, previous = 0, value = 128;
      size_t raised_before = k;
      for (int level = 2; level <= 5; ++level) {
        size_t raised = 0;
        while (raised < raised_before && budget >= value - previous) {
          gaps[raised++] = value;
          budget -= value - previous;
        }
        raised_before = raised;
        previous = value;
        value *= 128;
      }
      std::vector<uint32_t> indices;
      uint64_t next = 0;
      for (uint64_t g : gaps) {
        indices.push_back(static_cast<uint32_t>(next + g));
        next += g + 1;
      }
      ASSERT_LE(indices.back(), n - 1);
      EXPECT_EQ(payload_bytes(Encoding::delta_varint, n, indices), payload_bytes_bound(Encoding::delta_varint, n, k))
          << n << " " << k;
    }
  }
}

TEST(SparseEncoding, BadSelectionsAreRejected) {
  std::vector<uint8_t> buffer;
  const std::vector<float> two = {1.f, 2.f};
  EXPECT_THROW(append_layer(buffer, Encoding::key_value, WireValue::f16, 10, std::vector<uint32_t>{3, 3}, two),
               std::invalid_argument);
  EXPECT_THROW(append_layer(buffer, Encoding::bitmap, WireValue::f16, 10, std::vector<uint32_t>{3, 10}, two),
               std::invalid_argument);
  EXPECT_THROW(append_layer(buffer, Encoding::bitmap, WireValue::f16, 10, std::vector<uint32_t>{3}, two),
               std::invalid_argument);
  EXPECT_TRUE(buffer.empty());
}

// Every prefix that ends inside a record throws; one that ends between records decodes those.
// Random byte corruption throws or decodes, never reads out of bounds (each decode reads a copy
// of exactly the corrupt size).
TEST(SparseEncoding, TruncatedAndCorruptBuffersThrow) {
  std::mt19937 rng(4);
  std::vector<uint8_t> buffer;
  std::vector<size_t> ends;
  for (int i = 0; i < 6; ++i) {
    const Selection s = random_selection(777, 1 + rng() % 100, rng);
    append_layer(buffer, kForms[i % 3], WireValue::bf16, s.n, s.indices, s.values);
    ends.push_back(buffer.size());
  }
  for (size_t size = 0; size < buffer.size(); ++size) {
    const std::vector<uint8_t> prefix(buffer.begin(), buffer.begin() + size);
    const auto end = std::find(ends.begin(), ends.end(), size);
    if (size == 0 || end != ends.end()) {
      EXPECT_EQ(decode_layers(prefix).size(), size == 0 ? 0u : static_cast<size_t>(end - ends.begin()) + 1);
    } else {
      EXPECT_THROW(decode_layers(prefix), std::runtime_error) << size;
    }
  }
  try {
    decode_layers(std::vector<uint8_t>(buffer.begin(), buffer.begin() + 20));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("record 0 at byte 0: truncated payload"), std::string::npos) << e.what();
  }
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> corrupt = buffer;
    for (int flips = 1 + trial % 4; flips > 0; --flips)
      corrupt[rng() % corrupt.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    try {
      decode_layers(corrupt);
    } catch (const std::runtime_error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);  // most flips hit a header or index byte; flips of value bits decode
  // Specific corruptions.
  std::vector<uint8_t> bad = buffer;
  bad[0] = 7;
  EXPECT_THROW(decode_layers(bad), std::runtime_error);
  bad = buffer;
  bad[2] = 1;
  EXPECT_THROW(decode_layers(bad), std::runtime_error);
  bad = buffer;
  bad[8] = 0xFF, bad[9] = 0xFF, bad[10] = 0xFF, bad[11] = 0xFF;  // k > n
  EXPECT_THROW(decode_layers(bad), std::runtime_error);
}

}  // namespace
}  // namespace fusekit::dp
