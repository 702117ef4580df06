#include "models/json_header.h"

#include <charconv>
#include <cstdlib>
#include <stdexcept>

namespace fusekit::models {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("json: " + what + " at byte " + std::to_string(pos_));
  }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  char peek() {
    if (pos_ >= text_.size()) fail("unexpected end");
    return text_[pos_];
  }

  void expect_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("unexpected character");
    pos_ += word.size();
  }

  JsonValue parse_value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    skip_space();
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return JsonValue::string(parse_string());
    if (c == 't') return expect_word("true"), JsonValue::boolean(true);
    if (c == 'f') return expect_word("false"), JsonValue::boolean(false);
    if (c == 'n') return expect_word("null"), JsonValue::null();
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    fail(std::string("unexpected character '") + c + "'");
  }

  JsonValue parse_object(int depth) {
    ++pos_;  // {
    std::vector<std::pair<std::string, JsonValue>> members;
    skip_space();
    if (peek() == '}') return ++pos_, JsonValue::object(std::move(members));
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      const size_t key_at = pos_;
      std::string key = parse_string();
      for (const auto& member : members) {
        if (member.first == key) {
          pos_ = key_at;
          fail("repeated key \"" + key + "\"");
        }
      }
      skip_space();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      JsonValue value = parse_value(depth + 1);
      members.emplace_back(std::move(key), std::move(value));
      skip_space();
      const char c = peek();
      ++pos_;
      if (c == '}') return JsonValue::object(std::move(members));
      if (c != ',') --pos_, fail("expected ',' or '}'");
    }
  }

  JsonValue parse_array(int depth) {
    ++pos_;  // [
    std::vector<JsonValue> items;
    skip_space();
    if (peek() == ']') return ++pos_, JsonValue::array(std::move(items));
    while (true) {
      items.push_back(parse_value(depth + 1));
      skip_space();
      const char c = peek();
      ++pos_;
      if (c == ']') return JsonValue::array(std::move(items));
      if (c != ',') --pos_, fail("expected ',' or ']'");
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        value |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        value |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        --pos_, fail("bad hex digit in \\u escape");
      }
    }
    return value;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // "
    std::string out;
    while (true) {
      const char c = peek();
      ++pos_;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) --pos_, fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (text_.substr(pos_, 2) != "\\u") fail("unpaired surrogate");
            pos_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_, fail("bad escape");
      }
    }
  }

  JsonValue parse_number() {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == from) fail("expected a digit");
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else {
      digits();
    }
    if (pos_ < text_.size() && text_[pos_] == '.') ++pos_, digits();
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      digits();
    }
    return JsonValue::number(std::string(text_.substr(start, pos_ - start)));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

const char* kind_name(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::null:
      return "null";
    case JsonValue::Kind::boolean:
      return "a boolean";
    case JsonValue::Kind::number:
      return "a number";
    case JsonValue::Kind::string:
      return "a string";
    case JsonValue::Kind::array:
      return "an array";
    case JsonValue::Kind::object:
      return "an object";
  }
  return "?";
}

void require_kind(const JsonValue& value, JsonValue::Kind kind) {
  if (value.kind() != kind) {
    throw std::runtime_error(std::string("json: expected ") + kind_name(kind) + ", got " + kind_name(value.kind()));
  }
}

void write_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

void write_value(std::string& out, const JsonValue& v) {
  switch (v.kind()) {
    case JsonValue::Kind::null:
      out += "null";
      break;
    case JsonValue::Kind::boolean:
      out += v.as_bool() ? "true" : "false";
      break;
    case JsonValue::Kind::number:
      out += v.number_text();
      break;
    case JsonValue::Kind::string:
      write_string(out, v.as_string());
      break;
    case JsonValue::Kind::array: {
      out += '[';
      bool first = true;
      for (const JsonValue& item : v.as_array()) {
        if (!first) out += ',';
        first = false;
        write_value(out, item);
      }
      out += ']';
      break;
    }
    case JsonValue::Kind::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        write_string(out, key);
        out += ':';
        write_value(out, value);
      }
      out += '}';
      break;
    }
  }
}

}  // namespace

bool JsonValue::as_bool() const { return require_kind(*this, Kind::boolean), boolean_; }

int64_t JsonValue::as_int64() const {
  require_kind(*this, Kind::number);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text_.data(), text_.data() + text_.size(), value);
  if (error != std::errc() || end != text_.data() + text_.size()) {
    throw std::runtime_error("json: " + text_ + " is not an integer in int64's range");
  }
  return value;
}

double JsonValue::as_double() const { return require_kind(*this, Kind::number), std::strtod(text_.c_str(), nullptr); }

const std::string& JsonValue::number_text() const { return require_kind(*this, Kind::number), text_; }

const std::string& JsonValue::as_string() const { return require_kind(*this, Kind::string), text_; }

const std::vector<JsonValue>& JsonValue::as_array() const { return require_kind(*this, Kind::array), items_; }

const std::vector<std::pair<std::string, JsonValue>>& JsonValue::as_object() const {
  return require_kind(*this, Kind::object), members_;
}

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [name, value] : as_object()) {
    if (name == key) return &value;
  }
  return nullptr;
}

JsonValue JsonValue::null() { return JsonValue(); }

JsonValue JsonValue::boolean(bool value) {
  JsonValue v;
  v.kind_ = Kind::boolean;
  v.boolean_ = value;
  return v;
}

JsonValue JsonValue::number(std::string text) {
  JsonValue v;
  v.kind_ = Kind::number;
  v.text_ = std::move(text);
  return v;
}

JsonValue JsonValue::integer(int64_t value) { return number(std::to_string(value)); }

JsonValue JsonValue::string(std::string value) {
  JsonValue v;
  v.kind_ = Kind::string;
  v.text_ = std::move(value);
  return v;
}

JsonValue JsonValue::array(std::vector<JsonValue> items) {
  JsonValue v;
  v.kind_ = Kind::array;
  v.items_ = std::move(items);
  return v;
}

JsonValue JsonValue::object(std::vector<std::pair<std::string, JsonValue>> members) {
  JsonValue v;
  v.kind_ = Kind::object;
  v.members_ = std::move(members);
  return v;
}

JsonValue parse_json(std::string_view text) { return Parser(text).document(); }

std::string write_json(const JsonValue& value) {
  std::string out;
  write_value(out, value);
  return out;
}

}  // namespace fusekit::models
