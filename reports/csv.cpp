#include "reports/csv.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
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
  std::string out = csv_line({"run_id",
                              "name",
                              "op",
                              "shape",
                              "dtype",
                              "variant",
                              "samples",
                              "median_us",
                              "q1_us",
                              "q3_us",
                              "min_us",
                              "max_us",
                              "speedup",
                              "bytes",
                              "bandwidth_GBps",
                              "bandwidth_percent",
                              "flops",
                              "tflops",
                              "peak_memory_mib",
                              "items_per_second"});
  for (const CaseResult& c : report.cases) {
    out += csv_line({std::to_string(report.run.id),
                     c.info.name,
                     c.info.op,
                     c.info.shape,
                     c.info.dtype,
                     c.info.variant,
                     std::to_string(c.samples_ns.size()),
                     fixed(c.median_ns / 1e3, 3),
                     fixed(c.q1_ns / 1e3, 3),
                     fixed(c.q3_ns / 1e3, 3),
                     fixed(c.min_ns / 1e3, 3),
                     fixed(c.max_ns / 1e3, 3),
                     fixed(c.speedup, 4),
                     fixed(c.info.bytes, 0),
                     fixed(c.bandwidth_bytes_per_s, 3, 1e-9),
                     fixed(c.bandwidth_percent, 1),
                     fixed(c.info.flops, 0),
                     fixed(c.flops_per_s, 4, 1e-12),
                     fixed(peak_memory_mib(c), 0),
                     fixed(items_per_second(c), 1)});
  }
  return out;
}

std::string cases_wide_csv(const RunReport& report) {
  // The variants in column order, and each case's medians by variant, in the run's case order.
  std::vector<std::string> variants;
  std::vector<std::string> names;
  std::map<std::string, const CaseResult*> first_of;
  std::map<std::string, std::map<std::string, double>> medians;
  for (const CaseResult& c : report.cases) {
    if (std::find(variants.begin(), variants.end(), c.info.variant) == variants.end())
      variants.push_back(c.info.variant);
    if (!first_of.count(c.info.name)) {
      first_of[c.info.name] = &c;
      names.push_back(c.info.name);
    }
    medians[c.info.name][c.info.variant] = c.median_ns;
  }
  auto rank = [](const std::string& v) { return v == "fused" ? 0 : v == "baseline" ? 1 : 2; };
  std::sort(variants.begin(), variants.end(),
            [&](const std::string& a, const std::string& b) { return rank(a) != rank(b) ? rank(a) < rank(b) : a < b; });
  std::vector<std::string> header = {"run_id", "name", "op", "shape", "dtype", "bytes"};
  for (const std::string& v : variants) header.push_back(v + "_median_us");
  for (const char* h : {"fused_vs_baseline", "best_other", "fused_vs_best_other"}) header.push_back(h);
  std::string out = csv_line(header);
  for (const std::string& name : names) {
    const CaseResult& c = *first_of[name];
    const std::map<std::string, double>& m = medians[name];
    std::vector<std::string> row = {std::to_string(report.run.id), name, c.info.op, c.info.shape, c.info.dtype,
                                    fixed(c.info.bytes, 0)};
    for (const std::string& v : variants) row.push_back(m.count(v) ? fixed(m.at(v) / 1e3, 3) : "");
    const auto fused = m.find("fused");
    const auto baseline = m.find("baseline");
    row.push_back(fused != m.end() && baseline != m.end() ? fixed(baseline->second / fused->second, 4) : "");
    const std::pair<const std::string, double>* best = nullptr;
    for (const auto& entry : m) {
      const bool fusekit_variant = entry.first.rfind("fused", 0) == 0;  // fused, fused:no-master, ...
      if (!fusekit_variant && (!best || entry.second < best->second)) best = &entry;
    }
    row.push_back(best ? best->first : "");
    row.push_back(fused != m.end() && best ? fixed(best->second / fused->second, 4) : "");
    out += csv_line(row);
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

std::string categories_csv(const RunReport& report) {
  std::vector<std::string> header = {"run_id", "name", "variant", "repetitions", "kernels", "gpu_us", "gpu_us_per_rep"};
  for (profiler::KernelCategory c : profiler::kKernelCategories) {
    header.push_back(std::string(profiler::category_key(c)) + "_percent");
    header.push_back(std::string(profiler::category_key(c)) + "_us_per_rep");
  }
  std::string out = csv_line(header);
  for (const CaseBreakdown& b : report.case_breakdowns) {
    const profiler::RangeBreakdown& d = b.breakdown;
    const double reps = static_cast<double>(d.repetitions);
    auto per_rep = [&](uint64_t ns) { return d.repetitions > 0 ? fixed(static_cast<double>(ns) / reps / 1e3, 3) : ""; };
    std::vector<std::string> row = {std::to_string(report.run.id),
                                    b.name,
                                    b.variant,
                                    std::to_string(d.repetitions),
                                    std::to_string(d.kernels),
                                    fixed(static_cast<double>(d.gpu_ns) / 1e3, 3),
                                    per_rep(d.gpu_ns)};
    for (profiler::KernelCategory c : profiler::kKernelCategories) {
      const uint64_t ns = d.category_ns[static_cast<size_t>(c)];
      row.push_back(d.gpu_ns > 0 ? fixed(100.0 * static_cast<double>(ns) / static_cast<double>(d.gpu_ns), 2) : "");
      row.push_back(per_rep(ns));
    }
    out += csv_line(row);
  }
  return out;
}

std::string step_ranges_csv(const RunReport& report) {
  std::string out = csv_line({"run_id", "name", "variant", "range", "depth", "percent", "us_per_rep"});
  for (const CaseBreakdown& b : report.case_breakdowns) {
    const profiler::RangeBreakdown& d = b.breakdown;
    for (const profiler::NestedRangeTime& n : d.nested) {
      std::string path;
      for (const std::string& p : n.path) path += (path.empty() ? "" : " > ") + p;
      out += csv_line(
          {std::to_string(report.run.id), b.name, b.variant, path, std::to_string(n.path.size()),
           d.gpu_ns > 0 ? fixed(100.0 * static_cast<double>(n.gpu_ns) / static_cast<double>(d.gpu_ns), 2) : "",
           d.repetitions > 0 ? fixed(static_cast<double>(n.gpu_ns) / static_cast<double>(d.repetitions) / 1e3, 3)
                             : ""});
    }
  }
  return out;
}

}  // namespace fusekit::reports
