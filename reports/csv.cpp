#include "reports/csv.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

namespace fusekit::reports {
namespace {

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string fixed(const std::optional<double>& value, int decimals, double scale = 1) {
  return value ? fixed(*value * scale, decimals) : "";
}

std::string csv_line(const std::vector<std::string>& cells) {
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) {
    const std::string& cell = cells[i];
    if (i) out += ',';
    if (cell.find_first_of(",\"\r\n") == std::string::npos) {
      out += cell;
      continue;
    }
    out += '"';
    for (char c : cell) {
      if (c == '"') out += '"';
      out += c;
    }
    out += '"';
  }
  return out + "\n";
}

}  // namespace

std::string cases_csv(const RunReport& report) {
  std::string out =
      csv_line({"run_id", "name", "op", "shape", "dtype", "variant", "samples", "median_us", "q1_us", "q3_us", "min_us",
                "max_us", "speedup", "bytes", "bandwidth_GBps", "bandwidth_percent", "flops", "tflops"});
  for (const CaseResult& c : report.cases) {
    out += csv_line({std::to_string(report.run.id), c.info.name, c.info.op, c.info.shape, c.info.dtype, c.info.variant,
                     std::to_string(c.samples_ns.size()), fixed(c.median_ns / 1e3, 3), fixed(c.q1_ns / 1e3, 3),
                     fixed(c.q3_ns / 1e3, 3), fixed(c.min_ns / 1e3, 3), fixed(c.max_ns / 1e3, 3), fixed(c.speedup, 4),
                     fixed(c.info.bytes, 0), fixed(c.bandwidth_bytes_per_s, 3, 1e-9), fixed(c.bandwidth_percent, 1),
                     fixed(c.info.flops, 0), fixed(c.flops_per_s, 4, 1e-12)});
  }
  return out;
}

std::string kernels_csv(const RunReport& report) {
  std::string out = csv_line({"Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)",
                              "Max (ns)", "StdDev (ns)", "Name"});
  for (const profiler::KernelStats& k : report.kernels) {
    out += csv_line({fixed(k.time_percent, 1), std::to_string(k.total_ns), std::to_string(k.instances),
                     fixed(k.avg_ns, 1), fixed(k.med_ns, 1), std::to_string(k.min_ns), std::to_string(k.max_ns),
                     fixed(k.stddev_ns, 1), k.name});
  }
  return out;
}

std::string ranges_csv(const RunReport& report) {
  std::string out =
      csv_line({"Wall (ns)", "GPU Busy (ns)", "Idle (%)", "Instances", "Kernels", "Kernel Time (ns)", "Name"});
  for (const profiler::RangeStats& r : report.ranges) {
    out += csv_line({std::to_string(r.wall_ns), std::to_string(r.busy_ns), fixed(100 * r.idle_fraction, 1),
                     std::to_string(r.instances), std::to_string(r.kernels), std::to_string(r.kernel_ns), r.name});
  }
  return out;
}

}  // namespace fusekit::reports
