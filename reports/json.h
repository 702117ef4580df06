// The RunReport as one JSON document, and the JSON pieces the HTML and Chrome-trace writers share.
//
// Everything in the report goes out, every sample included, with the struct's field names. Numbers are
// written in their shortest form that reads back to the same double; a NaN or infinity becomes null, and
// an absent optional is null too, so a reader tells "not measured" from zero.
#pragma once

#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "reports/run_report.h"

namespace fusekit::reports {

std::string report_json(const RunReport& report);

// A quoted JSON string; control characters as \u00XX; valid UTF-8 kept as is, each invalid byte as U+FFFD.
std::string json_string(std::string_view text);
std::string json_number(double value);
std::string json_number(std::optional<double> value);
template <std::integral T>
std::string json_number(T value) {
  if constexpr (std::same_as<T, bool>)
    return value ? "true" : "false";
  else
    return std::to_string(value);
}

template <class T>
concept JsonNumber = std::is_arithmetic_v<T> || std::same_as<T, std::optional<double>>;

// Builds one JSON object member by member: JsonObject().add("name", k.name).add("ns", k.total_ns).str().
class JsonObject {
 public:
  JsonObject& raw(std::string_view key, std::string_view json);
  JsonObject& add(std::string_view key, std::string_view text) { return raw(key, json_string(text)); }
  template <JsonNumber N>
  JsonObject& add(std::string_view key, N number) {
    return raw(key, json_number(number));
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

// Elements already in JSON, joined into an array.
std::string json_array(const std::vector<std::string>& elements);

}  // namespace fusekit::reports
