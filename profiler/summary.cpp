#include "profiler/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace fusekit::profiler {

uint64_t union_length(std::vector<std::pair<uint64_t, uint64_t>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  uint64_t total = 0;
  uint64_t covered_to = 0;
  bool any = false;
  for (auto [start, end] : intervals) {
    if (end <= start) continue;
    if (!any || start >= covered_to) {
      total += end - start;
      covered_to = end;
      any = true;
    } else if (end > covered_to) {
      total += end - covered_to;
      covered_to = end;
    }
  }
  return total;
}

double median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

std::vector<KernelStats> summarize_kernels(const Trace& trace, const Attribution& attribution,
                                           const std::optional<std::string>& only_range, bool short_names) {
  std::map<std::string, std::vector<double>> durations;
  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    const KernelRecord& k = trace.kernels[i];
    if (only_range) {
      bool inside = false;
      for (int r = attribution.kernel_range[i]; r != kNoRange && !inside; r = attribution.range_parent[r]) {
        inside = trace.ranges[r].text == *only_range;
      }
      if (!inside) continue;
    }
    const uint64_t duration = k.end > k.start ? k.end - k.start : 0;
    durations[short_names ? short_kernel_name(k.name) : k.name].push_back(static_cast<double>(duration));
  }
  double grand_total = 0;
  std::vector<KernelStats> out;
  for (auto& [name, d] : durations) {
    KernelStats s;
    s.name = name;
    s.instances = d.size();
    double sum = 0;
    for (double x : d) sum += x;
    s.total_ns = static_cast<uint64_t>(sum);
    s.avg_ns = sum / static_cast<double>(d.size());
    s.min_ns = static_cast<uint64_t>(*std::min_element(d.begin(), d.end()));
    s.max_ns = static_cast<uint64_t>(*std::max_element(d.begin(), d.end()));
    double sq = 0;
    for (double x : d) sq += (x - s.avg_ns) * (x - s.avg_ns);
    s.stddev_ns = d.size() > 1 ? std::sqrt(sq / static_cast<double>(d.size() - 1)) : 0.0;
    s.med_ns = median(d);
    grand_total += sum;
    out.push_back(std::move(s));
  }
  for (KernelStats& s : out)
    s.time_percent = grand_total > 0 ? 100.0 * static_cast<double>(s.total_ns) / grand_total : 0;
  std::sort(out.begin(), out.end(), [](const KernelStats& a, const KernelStats& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return out;
}

std::vector<RangeStats> summarize_ranges(const Trace& trace, const Attribution& attribution) {
  // Kernels of each range instance, inclusive of nested ranges.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> intervals(trace.ranges.size());
  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    for (int r = attribution.kernel_range[i]; r != kNoRange; r = attribution.range_parent[r]) {
      intervals[r].emplace_back(trace.kernels[i].start, trace.kernels[i].end);
    }
  }
  uint64_t trace_end = 0;
  for (const KernelRecord& k : trace.kernels) trace_end = std::max(trace_end, k.end);
  for (const ApiRecord& a : trace.api_calls) trace_end = std::max(trace_end, a.end);
  for (const RangeRecord& r : trace.ranges) trace_end = std::max({trace_end, r.start, r.end});

  std::map<std::string, RangeStats> by_name;
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    const RangeRecord& range = trace.ranges[r];
    RangeStats& s = by_name[range.text];
    s.name = range.text;
    s.instances += 1;
    const uint64_t end = range.end != 0 ? range.end : trace_end;
    s.wall_ns += end > range.start ? end - range.start : 0;
    uint64_t last = end;
    s.kernels += intervals[r].size();
    for (auto [a, b] : intervals[r]) {
      s.kernel_ns += b > a ? b - a : 0;
      last = std::max(last, b);
    }
    s.extent_ns += last > range.start ? last - range.start : 0;
    s.busy_ns += union_length(std::move(intervals[r]));
  }
  std::vector<RangeStats> out;
  for (auto& [name, s] : by_name) {
    s.idle_fraction =
        s.extent_ns > 0 ? std::max(0.0, 1.0 - static_cast<double>(s.busy_ns) / static_cast<double>(s.extent_ns)) : 0.0;
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const RangeStats& a, const RangeStats& b) {
    return a.wall_ns != b.wall_ns ? a.wall_ns > b.wall_ns : a.name < b.name;
  });
  return out;
}

RunTotals summarize_run(const Trace& trace) {
  RunTotals t;
  uint64_t first = std::numeric_limits<uint64_t>::max();
  uint64_t last = 0;
  auto see = [&](uint64_t start, uint64_t end) {
    if (start != 0) first = std::min(first, start);
    last = std::max({last, start, end});
  };
  std::vector<std::pair<uint64_t, uint64_t>> busy;
  for (const KernelRecord& k : trace.kernels) {
    see(k.start, k.end);
    busy.emplace_back(k.start, k.end);
    t.kernel_ns += k.end > k.start ? k.end - k.start : 0;
  }
  for (const MemcpyRecord& m : trace.memcpys) {
    see(m.start, m.end);
    t.memcpy_bytes += m.bytes;
  }
  for (const MemsetRecord& m : trace.memsets) see(m.start, m.end);
  for (const ApiRecord& a : trace.api_calls) see(a.start, a.end);
  for (const RangeRecord& r : trace.ranges) see(r.start, r.end);
  t.kernels = trace.kernels.size();
  t.memcpys = trace.memcpys.size();
  t.memsets = trace.memsets.size();
  t.api_calls = trace.api_calls.size();
  t.ranges = trace.ranges.size();
  t.wall_ns = last > first ? last - first : 0;
  t.busy_ns = union_length(std::move(busy));
  t.idle_fraction =
      t.wall_ns > 0 ? std::max(0.0, 1.0 - static_cast<double>(t.busy_ns) / static_cast<double>(t.wall_ns)) : 0.0;
  return t;
}

}  // namespace fusekit::profiler
