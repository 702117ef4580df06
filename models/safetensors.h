// Reading and writing .safetensors files (Hugging Face's format for tensors):
//
//   8 bytes    N, the header's length, unsigned little-endian
//   N bytes    a JSON object: per tensor "name": {"dtype": "F16", "shape": [2, 3], "data_offsets": [begin, end]},
//              and optionally "__metadata__": {string: string}; padded with spaces
//   the rest   the data: tensor bytes at [begin, end) relative to the data's start, little-endian,
//              row-major, covering the data without gaps or overlaps
//
// Reading validates all of it and names the file and the tensor in each error (std::runtime_error):
// a file shorter than its header, a header that is not a JSON object, a missing or malformed field,
// an unknown dtype, a range whose size is not shape x element size, a range past the end of the file
// (a truncated file), overlapping ranges, bytes no tensor covers. The file is read into memory once;
// the tensors' bytes are views into it. Written files put the tensors in the order given, pad the
// header to a multiple of 8 bytes, and read back with Hugging Face's safetensors library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::models {

enum class TensorType { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

const char* tensor_type_name(TensorType type);  // the format's: "F64", "F32", "F16", "BF16", "I64", ... "BOOL"
size_t tensor_type_bytes(TensorType type);
std::optional<TensorType> parse_tensor_type(std::string_view name);
// F32, F16, BF16 as the kernels' storage types; nothing for the others.
std::optional<kernels::DType> storage_type(TensorType type);
TensorType tensor_type(kernels::DType storage);

struct TensorView {
  std::string name;
  TensorType type = TensorType::f32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // shape's elements x the type's size

  size_t elements() const;
};

class SafetensorsFile {
 public:
  // Reads and validates the file at `path`.
  static SafetensorsFile read(const std::string& path);
  // Validates bytes already in memory; `label` names them in errors (a path, usually).
  static SafetensorsFile parse(std::vector<std::byte> contents, const std::string& label);

  const std::vector<TensorView>& tensors() const { return tensors_; }  // in file order of their offsets
  const TensorView* find(std::string_view name) const;                 // or null
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }

  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;

 private:
  SafetensorsFile() = default;
  std::vector<std::byte> contents_;
  std::vector<TensorView> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

// Writes the tensors (each view's bytes must match its shape and type) and the metadata. Throws
// std::runtime_error for a bad tensor, a repeated name, or a file that cannot be written.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata = {});
// The same bytes in memory.
std::vector<std::byte> serialize_safetensors(const std::vector<TensorView>& tensors,
                                             const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace fusekit::models
