#include "models/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "models/json_header.h"

namespace fusekit::models {
namespace {

struct TypeInfo {
  TensorType type;
  const char* name;
  size_t bytes;
};

constexpr TypeInfo kTypes[] = {
    {TensorType::f64, "F64", 8},      {TensorType::f32, "F32", 4}, {TensorType::f16, "F16", 2},
    {TensorType::bf16, "BF16", 2},    {TensorType::i64, "I64", 8}, {TensorType::i32, "I32", 4},
    {TensorType::i16, "I16", 2},      {TensorType::i8, "I8", 1},   {TensorType::u8, "U8", 1},
    {TensorType::boolean, "BOOL", 1},
};

const TypeInfo& info(TensorType type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  throw std::logic_error("safetensors: unknown tensor type");
}

// Elements of a shape, or nothing on a negative dimension or overflow past 2^62.
std::optional<size_t> product(const std::vector<int64_t>& shape) {
  size_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && count > (size_t{1} << 62) / static_cast<size_t>(d)) return std::nullopt;
    count *= static_cast<size_t>(d);
  }
  return count;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

const char* tensor_type_name(TensorType type) { return info(type).name; }
size_t tensor_type_bytes(TensorType type) { return info(type).bytes; }

std::optional<TensorType> parse_tensor_type(std::string_view name) {
  for (const TypeInfo& t : kTypes) {
    if (name == t.name) return t.type;
  }
  return std::nullopt;
}

std::optional<kernels::DType> storage_type(TensorType type) {
  switch (type) {
    case TensorType::f32:
      return kernels::DType::f32;
    case TensorType::f16:
      return kernels::DType::f16;
    case TensorType::bf16:
      return kernels::DType::bf16;
    default:
      return std::nullopt;
  }
}

TensorType tensor_type(kernels::DType storage) {
  switch (storage) {
    case kernels::DType::f32:
      return TensorType::f32;
    case kernels::DType::f16:
      return TensorType::f16;
    case kernels::DType::bf16:
      return TensorType::bf16;
  }
  throw std::logic_error("safetensors: unknown storage type");
}

size_t TensorView::elements() const { return product(shape).value_or(0); }

const TensorView* SafetensorsFile::find(std::string_view name) const {
  for (const TensorView& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("safetensors: " + path + ": cannot open the file");
  const std::streamoff size = in.tellg();
  std::vector<std::byte> contents(static_cast<size_t>(std::max<std::streamoff>(size, 0)));
  in.seekg(0);
  if (!contents.empty() && !in.read(reinterpret_cast<char*>(contents.data()), size)) {
    throw std::runtime_error("safetensors: " + path + ": cannot read the file");
  }
  return parse(std::move(contents), path);
}

SafetensorsFile SafetensorsFile::parse(std::vector<std::byte> contents, const std::string& label) {
  const auto fail = [&](const std::string& what) -> void {
    throw std::runtime_error("safetensors: " + label + ": " + what);
  };
  if (contents.size() < 8)
    fail("shorter than the 8-byte header length (" + std::to_string(contents.size()) + " bytes)");
  const uint64_t header_bytes = read_le64(contents.data());
  if (header_bytes > contents.size() - 8) {
    fail("header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
         std::to_string(contents.size()) + " bytes): truncated or not a safetensors file");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(contents.data() + 8), header_bytes);
  JsonValue header;
  try {
    header = parse_json(header_text);
  } catch (const std::runtime_error& e) {
    fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail("header is not a JSON object");

  SafetensorsFile file;
  const std::byte* data = contents.data() + 8 + header_bytes;
  const size_t data_bytes = contents.size() - 8 - header_bytes;
  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.as_object()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("__metadata__ is not an object");
      for (const auto& [key, value] : entry.as_object()) {
        if (value.kind() != JsonValue::Kind::string) fail("__metadata__ value of '" + key + "' is not a string");
        file.metadata_.emplace_back(key, value.as_string());
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!entry.is_object()) fail(where + "entry is not an object");
    const JsonValue* dtype = entry.find("dtype");
    const JsonValue* shape = entry.find("shape");
    const JsonValue* offsets = entry.find("data_offsets");
    if (!dtype || dtype->kind() != JsonValue::Kind::string) fail(where + "no dtype string");
    if (!shape || shape->kind() != JsonValue::Kind::array) fail(where + "no shape array");
    if (!offsets || offsets->kind() != JsonValue::Kind::array || offsets->as_array().size() != 2) {
      fail(where + "data_offsets is not an array of two integers");
    }
    TensorView view;
    view.name = name;
    const std::optional<TensorType> type = parse_tensor_type(dtype->as_string());
    if (!type) fail(where + "unknown dtype '" + dtype->as_string() + "'");
    view.type = *type;
    try {
      for (const JsonValue& d : shape->as_array()) view.shape.push_back(d.as_int64());
    } catch (const std::runtime_error&) {
      fail(where + "shape holds something other than integers");
    }
    const std::optional<size_t> elements = product(view.shape);
    if (!elements) fail(where + "shape has a negative dimension or is too large");
    int64_t begin = 0, end = 0;
    try {
      begin = offsets->as_array()[0].as_int64();
      end = offsets->as_array()[1].as_int64();
    } catch (const std::runtime_error&) {
      fail(where + "data_offsets holds something other than integers");
    }
    if (begin < 0 || end < begin) {
      fail(where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] is not a range");
    }
    if (static_cast<uint64_t>(end) > data_bytes) {
      fail(where + "data_offsets end " + std::to_string(end) + " is past the end of the data (" +
           std::to_string(data_bytes) + " bytes): truncated file");
    }
    const size_t expected = *elements * tensor_type_bytes(view.type);
    if (static_cast<size_t>(end - begin) != expected) {
      fail(where + "holds " + std::to_string(end - begin) + " bytes, its shape and dtype need " +
           std::to_string(expected));
    }
    view.bytes = std::span<const std::byte>(data + begin, static_cast<size_t>(end - begin));
    ranges.push_back({static_cast<uint64_t>(begin), static_cast<uint64_t>(end), file.tensors_.size()});
    file.tensors_.push_back(std::move(view));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    if (r.begin < covered) fail("tensor '" + file.tensors_[r.tensor].name + "': its bytes overlap another tensor's");
    if (r.begin > covered) {
      fail("bytes [" + std::to_string(covered) + ", " + std::to_string(r.begin) + ") of the data belong to no tensor");
    }
    covered = r.end;
  }
  if (covered != data_bytes) {
    fail("bytes [" + std::to_string(covered) + ", " + std::to_string(data_bytes) +
         ") at the end of the data belong to no tensor");
  }
  // Tensors in the order of their bytes; the views stay valid as the vector's buffer moves with it.
  std::vector<TensorView> ordered;
  for (const Range& r : ranges) ordered.push_back(std::move(file.tensors_[r.tensor]));
  file.tensors_ = std::move(ordered);
  file.contents_ = std::move(contents);
  return file;
}

std::vector<std::byte> serialize_safetensors(const std::vector<TensorView>& tensors,
                                             const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<std::pair<std::string, JsonValue>> members;
  if (!metadata.empty()) {
    std::vector<std::pair<std::string, JsonValue>> entries;
    for (const auto& [key, value] : metadata) entries.emplace_back(key, JsonValue::string(value));
    members.emplace_back("__metadata__", JsonValue::object(std::move(entries)));
  }
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__") throw std::runtime_error("safetensors: '__metadata__' cannot name a tensor");
    for (const auto& member : members) {
      if (member.first == t.name) throw std::runtime_error("safetensors: tensor '" + t.name + "' given twice");
    }
    const std::optional<size_t> elements = product(t.shape);
    if (!elements || *elements * tensor_type_bytes(t.type) != t.bytes.size()) {
      throw std::runtime_error("safetensors: tensor '" + t.name + "': its bytes do not match its shape and dtype");
    }
    std::vector<JsonValue> shape, offsets;
    for (int64_t d : t.shape) shape.push_back(JsonValue::integer(d));
    offsets.push_back(JsonValue::integer(static_cast<int64_t>(offset)));
    offset += t.bytes.size();
    offsets.push_back(JsonValue::integer(static_cast<int64_t>(offset)));
    members.emplace_back(t.name, JsonValue::object({{"dtype", JsonValue::string(tensor_type_name(t.type))},
                                                    {"shape", JsonValue::array(std::move(shape))},
                                                    {"data_offsets", JsonValue::array(std::move(offsets))}}));
  }
  std::string header = write_json(JsonValue::object(std::move(members)));
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + header.size() + offset);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::byte* data = out.data() + 8 + header.size();
  for (const TensorView& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(data, t.bytes.data(), t.bytes.size());
    data += t.bytes.size();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  const std::vector<std::byte> bytes = serialize_safetensors(tensors, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("safetensors: " + path + ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("safetensors: " + path + ": write failed");
}

}  // namespace fusekit::models
