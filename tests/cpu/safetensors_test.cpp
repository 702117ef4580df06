// safetensors: the JSON header parser, writing and reading back, each kind of corrupt file, and the
// host conversions between float, half and bfloat16.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "models/json_header.h"
#include "models/safetensors.h"
#include "models/storage_conversion.h"

namespace fusekit::models {
namespace {

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

std::string json_error(std::string_view text) {
  try {
    parse_json(text);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonHeader, ParsesWhatHeadersHold) {
  const JsonValue v = parse_json(
      R"( {"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}, "__metadata__": {"format": "pt"},
          "big": 9007199254740993, "neg": -1.5e3, "t": true, "f": false, "n": null, "s": "x\"\\\/\n\u00e9\ud83d\ude00"} )");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.as_object().size(), 8u);
  EXPECT_EQ(v.as_object()[0].first, "a");  // file order
  EXPECT_EQ(v.find("a")->find("shape")->as_array()[1].as_int64(), 3);
  EXPECT_EQ(v.find("big")->as_int64(), 9007199254740993LL);  // exact past 2^53
  EXPECT_DOUBLE_EQ(v.find("neg")->as_double(), -1500.0);
  EXPECT_THROW(v.find("neg")->as_int64(), std::runtime_error);
  EXPECT_TRUE(v.find("t")->as_bool());
  EXPECT_FALSE(v.find("f")->as_bool());
  EXPECT_EQ(v.find("n")->kind(), JsonValue::Kind::null);
  EXPECT_EQ(v.find("s")->as_string(), "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_THROW(v.find("s")->as_array(), std::runtime_error);
  // Written and read back to the same text.
  const std::string text = write_json(v);
  EXPECT_EQ(write_json(parse_json(text)), text);
  EXPECT_EQ(write_json(parse_json("[1,\"a\\u0001\",{}]")), "[1,\"a\\u0001\",{}]");
}

TEST(JsonHeader, RejectsMalformedText) {
  EXPECT_NE(json_error("").find("unexpected end"), std::string::npos);
  EXPECT_NE(json_error("{").find("unexpected end"), std::string::npos);
  EXPECT_NE(json_error("{\"a\":1,}").find("expected a string key"), std::string::npos);
  EXPECT_NE(json_error("{\"a\":1 \"b\":2}").find("expected ',' or '}'"), std::string::npos);
  EXPECT_NE(json_error("[1 2]").find("expected ',' or ']'"), std::string::npos);
  EXPECT_NE(json_error("{\"a\":1,\"a\":2}").find("repeated key \"a\""), std::string::npos);
  EXPECT_NE(json_error("{} x").find("unexpected text after the value at byte 3"), std::string::npos);
  EXPECT_NE(json_error("01").find("unexpected text"), std::string::npos);
  EXPECT_NE(json_error("-").find("expected a digit"), std::string::npos);
  EXPECT_NE(json_error("1.").find("expected a digit"), std::string::npos);
  EXPECT_NE(json_error("\"a\nb\"").find("control character"), std::string::npos);
  EXPECT_NE(json_error("\"\\x\"").find("bad escape"), std::string::npos);
  EXPECT_NE(json_error("\"\\u12g4\"").find("bad hex digit"), std::string::npos);
  EXPECT_NE(json_error("\"\\ud83d\"").find("unpaired surrogate"), std::string::npos);
  EXPECT_NE(json_error("tru").find("unexpected character"), std::string::npos);
  EXPECT_NE(json_error(std::string(100, '[') + std::string(100, ']')).find("deeper than 64"), std::string::npos);
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fusekit_safetensors_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file of the given header text and data bytes.
  std::vector<std::byte> file_of(const std::string& header, size_t data_bytes) const {
    std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0});
    for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
    std::memcpy(out.data() + 8, header.data(), header.size());
    return out;
  }
  std::string parse_error(std::vector<std::byte> contents) const {
    try {
      SafetensorsFile::parse(std::move(contents), "corrupt.safetensors");
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }

  std::filesystem::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryType) {
  const std::vector<float> f32 = {1.f, -2.5f, 3.25f, 0.f, 1e-3f, 7.f};
  const std::vector<uint16_t> f16 = {float_to_half(1.f), float_to_half(-0.5f)};
  const std::vector<uint16_t> bf16 = {float_to_bfloat16(3.f)};
  const std::vector<int64_t> i64 = {-100, 0, 30521, int64_t{1} << 40};
  const std::vector<double> f64 = {0.1};
  const std::vector<uint8_t> empty;
  const std::vector<TensorView> tensors = {
      {"w", TensorType::f32, {2, 3}, bytes_of(f32)},   {"h", TensorType::f16, {2}, bytes_of(f16)},
      {"b", TensorType::bf16, {1, 1}, bytes_of(bf16)}, {"ids", TensorType::i64, {4}, bytes_of(i64)},
      {"d", TensorType::f64, {}, bytes_of(f64)},       {"none", TensorType::u8, {0, 5}, bytes_of(empty)},
  };
  write_safetensors(path("t.safetensors"), tensors, {{"format", "pt"}, {"note", "a \"quoted\" value"}});
  const SafetensorsFile file = SafetensorsFile::read(path("t.safetensors"));
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (const TensorView& t : tensors) {
    const TensorView* read = file.find(t.name);
    ASSERT_NE(read, nullptr) << t.name;
    EXPECT_EQ(read->type, t.type) << t.name;
    EXPECT_EQ(read->shape, t.shape) << t.name;
    ASSERT_EQ(read->bytes.size(), t.bytes.size()) << t.name;
    EXPECT_EQ(std::memcmp(read->bytes.data(), t.bytes.data(), t.bytes.size()), 0) << t.name;
  }
  EXPECT_EQ(file.find("d")->elements(), 1u);  // a scalar
  ASSERT_EQ(file.metadata().size(), 2u);
  EXPECT_EQ(file.metadata()[1].second, "a \"quoted\" value");
  // The header is padded to 8 bytes, as the format recommends.
  std::ifstream in(path("t.safetensors"), std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  EXPECT_THROW(write_safetensors(path("bad.safetensors"), {{"w", TensorType::f32, {7}, bytes_of(f32)}}),
               std::runtime_error);
  EXPECT_THROW(write_safetensors(path("bad.safetensors"), {tensors[0], tensors[0]}), std::runtime_error);
}

TEST_F(SafetensorsTest, ReadsTypeNames) {
  for (const char* name : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}) {
    ASSERT_TRUE(parse_tensor_type(name).has_value()) << name;
    EXPECT_STREQ(tensor_type_name(*parse_tensor_type(name)), name);
  }
  EXPECT_FALSE(parse_tensor_type("F8_E4M3").has_value());
  EXPECT_EQ(storage_type(TensorType::bf16), kernels::DType::bf16);
  EXPECT_FALSE(storage_type(TensorType::i64).has_value());
}

TEST_F(SafetensorsTest, EachCorruptionHasItsError) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(parse_error(file_of(good, 8)), "");
  EXPECT_NE(parse_error(std::vector<std::byte>(5)).find("corrupt.safetensors: shorter than the 8-byte header length"),
            std::string::npos);
  std::vector<std::byte> long_header = file_of(good, 8);
  long_header[0] = std::byte{0xFF};
  long_header[1] = std::byte{0xFF};
  EXPECT_NE(parse_error(long_header).find("runs past the end of the file"), std::string::npos);
  EXPECT_NE(parse_error(file_of("{\"a\":", 0)).find("header is not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(file_of("[1]", 0)).find("header is not a JSON object"), std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8))
                .find("tensor 'a': unknown dtype 'F7'"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8)).find("tensor 'a': no dtype"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8)).find("tensor 'a': no shape"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8)).find("data_offsets"),
            std::string::npos);
  EXPECT_NE(
      parse_error(file_of(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)).find("negative dimension"),
      std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)).find("not a range"),
            std::string::npos);
  // Truncated: the data ends before the tensor's range does.
  EXPECT_NE(parse_error(file_of(good, 6)).find("tensor 'a': data_offsets end 8 is past the end of the data (6 bytes)"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8))
                .find("tensor 'a': holds 8 bytes, its shape and dtype need 12"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                8))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8))
                .find("bytes [0, 4) of the data belong to no tensor"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(good, 12)).find("bytes [8, 12) at the end of the data belong to no tensor"),
            std::string::npos);
  EXPECT_NE(parse_error(file_of(R"({"__metadata__":{"k":1}})", 0)).find("__metadata__ value of 'k'"),
            std::string::npos);
  EXPECT_NE(
      parse_error(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{}})", 8)).find("repeated key"),
      std::string::npos);
  // Reading names the path.
  try {
    SafetensorsFile::read(path("missing.safetensors"));
    FAIL() << "no error for a missing file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors: cannot open"), std::string::npos);
  }
}

TEST(StorageConversion, HalfRoundsToNearestEven) {
  EXPECT_EQ(float_to_half(1.f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.f), 0xC000);
  EXPECT_EQ(float_to_half(65504.f), 0x7BFF);  // largest half
  EXPECT_EQ(float_to_half(65519.f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(float_to_half(65520.f), 0x7C00);  // halfway: to even, which is infinity
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_half(std::nanf("")) & 0x7C00, 0x7C00);
  EXPECT_NE(float_to_half(std::nanf("")) & 0x03FF, 0);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to even (1); 1 + 3 * 2^-11 rounds up to 1 + 2^-9.
  EXPECT_EQ(float_to_half(1.f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(float_to_half(1.f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(float_to_half(1.f + 0x1p-11f + 0x1p-20f), 0x3C01);
  // Subnormals: 2^-24 is the smallest; 2^-25 is halfway to zero (even: 0); a bit more rounds up.
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);
  EXPECT_EQ(float_to_half(0x1p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(float_to_half(3 * 0x1p-25f), 0x0002);  // 1.5 units: to even
  EXPECT_EQ(float_to_half(-0x1p-30f), 0x8000);
  EXPECT_EQ(float_to_half(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up into the smallest normal
  // Every half converts to float and back to itself (NaNs stay NaN).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) << h;
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << h;
  }
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
}

TEST(StorageConversion, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // halfway, to even
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // halfway, to even (up)
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to infinity
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::bit_cast<float>(0x7F800001u)))));  // not inf
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bfloat16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bfloat16(f), b) << b;
  }
}

TEST(StorageConversion, ConvertsBuffers) {
  const std::vector<float> values = {0.1f, -3.f, 1e5f, 6e-8f};
  std::vector<uint16_t> half(values.size()), bf(values.size());
  std::vector<float> back(values.size());
  convert_storage(kernels::DType::f32, bytes_of(values).data(), kernels::DType::f16,
                  reinterpret_cast<std::byte*>(half.data()), values.size());
  EXPECT_EQ(half[0], float_to_half(0.1f));
  EXPECT_EQ(half[2], 0x7C00);  // 1e5 overflows half
  convert_storage(kernels::DType::f16, bytes_of(half).data(), kernels::DType::bf16,
                  reinterpret_cast<std::byte*>(bf.data()), values.size());
  EXPECT_EQ(bf[1], float_to_bfloat16(-3.f));
  convert_storage(kernels::DType::bf16, bytes_of(bf).data(), kernels::DType::f32,
                  reinterpret_cast<std::byte*>(back.data()), values.size());
  EXPECT_EQ(back[1], -3.f);
  EXPECT_NEAR(back[0], 0.1f, 1e-3f);
}

}  // namespace
}  // namespace fusekit::models
