#include "reports/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace fusekit::reports {

namespace {

// Length of the well-formed UTF-8 sequence at text[i] (Unicode table 3-7), 0 if there is none.
size_t utf8_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
  const unsigned lead = byte(0);
  size_t n = 0;
  unsigned low = 0x80, high = 0xBF;  // the range of the second byte; later bytes are always 80..BF
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (byte(1) < low || byte(1) > high) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  return n;
}

}  // namespace

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const size_t n = utf8_length(text, i);
      out += n ? text.substr(i, n) : "\\ufffd";
      i += n ? n - 1 : 0;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, value).ptr);
}

std::string json_number(std::optional<double> value) { return value ? json_number(*value) : "null"; }

JsonObject& JsonObject::raw(std::string_view key, std::string_view json) {
  if (!body_.empty()) body_ += ',';
  body_ += json_string(key);
  body_ += ':';
  body_ += json;
  return *this;
}

std::string json_array(const std::vector<std::string>& elements) {
  std::string out = "[";
  for (size_t i = 0; i < elements.size(); ++i) out += (i ? "," : "") + elements[i];
  return out + "]";
}

namespace {

std::string run_json(const RunInfo& r) {
  return JsonObject()
      .add("id", r.id)
      .add("started_at", r.started_at)
      .add("finished_at", r.finished_at)
      .add("label", r.label)
      .add("command_line", r.command_line)
      .add("git_commit", r.git_commit)
      .add("host", r.host)
      .add("gpu_name", r.gpu_name)
      .add("gpu_uuid", r.gpu_uuid)
      .add("driver_version", r.driver_version)
      .add("cuda_version", r.cuda_version)
      .add("libtorch_version", r.libtorch_version)
      .add("status", r.status)
      .add("exit_code", r.exit_code)
      .add("dropped_records", r.dropped_records)
      .add("copy_ceiling_bytes_per_second", r.copy_ceiling_bytes_per_second)
      .str();
}

std::string case_json(const CaseResult& c) {
  std::vector<std::string> samples;
  samples.reserve(c.samples_ns.size());
  for (double s : c.samples_ns) samples.push_back(json_number(s));
  JsonObject metrics;
  for (const store::CaseMetric& m : c.metrics) metrics.add(m.name, m.value);
  return JsonObject()
      .add("id", c.id)
      .add("name", c.info.name)
      .add("op", c.info.op)
      .add("shape", c.info.shape)
      .add("dtype", c.info.dtype)
      .add("variant", c.info.variant)
      .add("bytes", c.info.bytes)
      .add("flops", c.info.flops)
      .add("median_ns", c.median_ns)
      .add("q1_ns", c.q1_ns)
      .add("q3_ns", c.q3_ns)
      .add("min_ns", c.min_ns)
      .add("max_ns", c.max_ns)
      .add("speedup", c.speedup)
      .add("bandwidth_bytes_per_s", c.bandwidth_bytes_per_s)
      .add("bandwidth_percent", c.bandwidth_percent)
      .add("flops_per_s", c.flops_per_s)
      .raw("samples_ns", json_array(samples))
      .raw("metrics", metrics.str())
      .str();
}

std::string kernel_json(const profiler::KernelStats& k) {
  return JsonObject()
      .add("name", k.name)
      .add("time_percent", k.time_percent)
      .add("total_ns", k.total_ns)
      .add("instances", k.instances)
      .add("avg_ns", k.avg_ns)
      .add("med_ns", k.med_ns)
      .add("min_ns", k.min_ns)
      .add("max_ns", k.max_ns)
      .add("stddev_ns", k.stddev_ns)
      .str();
}

std::string range_json(const profiler::RangeStats& r) {
  return JsonObject()
      .add("name", r.name)
      .add("instances", r.instances)
      .add("wall_ns", r.wall_ns)
      .add("busy_ns", r.busy_ns)
      .add("kernels", r.kernels)
      .add("kernel_ns", r.kernel_ns)
      .add("idle_fraction", r.idle_fraction)
      .str();
}

std::string totals_json(const profiler::RunTotals& t) {
  return JsonObject()
      .add("wall_ns", t.wall_ns)
      .add("busy_ns", t.busy_ns)
      .add("kernel_ns", t.kernel_ns)
      .add("kernels", t.kernels)
      .add("memcpys", t.memcpys)
      .add("memcpy_bytes", t.memcpy_bytes)
      .add("memsets", t.memsets)
      .add("api_calls", t.api_calls)
      .add("ranges", t.ranges)
      .add("idle_fraction", t.idle_fraction)
      .str();
}

// One element per line, so a diff of two reports shows which case or kernel changed.
template <class T, class F>
std::string lines(const std::vector<T>& items, F to_json) {
  if (items.empty()) return "[]";
  std::string out = "[\n";
  for (size_t i = 0; i < items.size(); ++i) out += "  " + to_json(items[i]) + (i + 1 < items.size() ? ",\n" : "\n");
  return out + "]";
}

}  // namespace

std::string report_json(const RunReport& report) {
  return "{\"run\":" + run_json(report.run) + ",\n\"totals\":" + totals_json(report.totals) +
         ",\n\"cases\":" + lines(report.cases, case_json) + ",\n\"kernels\":" + lines(report.kernels, kernel_json) +
         ",\n\"ranges\":" + lines(report.ranges, range_json) + "}\n";
}

}  // namespace fusekit::reports
