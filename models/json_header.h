// A small JSON parser, as much as a safetensors header needs: objects, arrays, strings (escapes and
// \u sequences, surrogate pairs included, decoded to UTF-8), numbers, true, false, null; and a
// writer of the same. Objects keep their members in file order and reject a repeated key.
//
// Numbers keep their text: as_int64() reads an integer exactly (shapes and byte offsets may exceed
// 2^53), as_double() any number. Nesting is limited to 64 levels, which no header comes near.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fusekit::models {

class JsonValue {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::object; }
  // Each throws std::runtime_error when the value is of another kind (as_int64: not an integer in
  // int64's range).
  bool as_bool() const;
  int64_t as_int64() const;
  double as_double() const;
  const std::string& number_text() const;  // a number as written
  const std::string& as_string() const;
  const std::vector<JsonValue>& as_array() const;
  const std::vector<std::pair<std::string, JsonValue>>& as_object() const;
  const JsonValue* find(std::string_view key) const;  // an object's member, or null

  static JsonValue null();
  static JsonValue boolean(bool value);
  static JsonValue number(std::string text);  // the caller gives valid JSON number text
  static JsonValue integer(int64_t value);
  static JsonValue string(std::string value);
  static JsonValue array(std::vector<JsonValue> items);
  static JsonValue object(std::vector<std::pair<std::string, JsonValue>> members);

 private:
  Kind kind_ = Kind::null;
  bool boolean_ = false;
  std::string text_;  // a string's value or a number's text
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Throws std::runtime_error "json: <what> at byte <n>" for malformed text or trailing garbage.
JsonValue parse_json(std::string_view text);

// Compact JSON (no spaces), members in order; strings escaped as JSON requires.
std::string write_json(const JsonValue& value);

}  // namespace fusekit::models
