#include "profiler/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

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

std::vector<RangeBreakdown> break_down_ranges(const Trace& trace, const Attribution& attribution,
                                              const std::vector<std::string>& names, const std::string& repetition) {
  std::vector<RangeBreakdown> out(names.size());
  std::unordered_map<std::string, size_t> slot_of_name;
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].name = names[i];
    slot_of_name.emplace(names[i], i);
  }
  // Each range's slot among `names`, or -1.
  std::vector<int> slot(trace.ranges.size(), -1);
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    auto it = slot_of_name.find(trace.ranges[r].text);
    if (it == slot_of_name.end()) continue;
    slot[r] = static_cast<int>(it->second);
    ++out[it->second].instances;
  }
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    if (trace.ranges[r].text != repetition) continue;
    for (int p = attribution.range_parent[r]; p != kNoRange; p = attribution.range_parent[p]) {
      if (slot[p] >= 0) {
        ++out[slot[p]].repetitions;
        break;
      }
    }
  }

  // The nested paths of each breakdown, by path.
  std::vector<std::map<std::vector<std::string>, NestedRangeTime>> nested(names.size());
  std::vector<int> chain;  // the ranges between an activity and its broken-down range, innermost first
  auto add = [&](int range, uint64_t start, uint64_t end, KernelCategory category, bool kernel) {
    chain.clear();
    int outer = kNoRange;
    for (int r = range; r != kNoRange; r = attribution.range_parent[r]) {
      if (slot[r] >= 0) {
        outer = r;
        break;
      }
      if (trace.ranges[r].text != repetition) chain.push_back(r);
    }
    if (outer == kNoRange) return;
    RangeBreakdown& b = out[slot[outer]];
    const uint64_t duration = end > start ? end - start : 0;
    b.gpu_ns += duration;
    b.category_ns[static_cast<size_t>(category)] += duration;
    b.kernels += kernel ? 1 : 0;
    std::vector<std::string> path;
    for (auto r = chain.rbegin(); r != chain.rend(); ++r) {
      path.push_back(trace.ranges[*r].text);
      auto [it, inserted] = nested[slot[outer]].try_emplace(path);
      NestedRangeTime& row = it->second;
      if (inserted) {
        row.path = path;
        row.first_start = trace.ranges[*r].start;
      }
      row.gpu_ns += duration;
      row.first_start = std::min(row.first_start, trace.ranges[*r].start);
    }
  };
  std::unordered_map<std::string, KernelCategory> category_of_name;  // a few hundred names, many launches
  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    const KernelRecord& k = trace.kernels[i];
    if (attribution.kernel_range[i] == kNoRange) continue;
    auto [it, inserted] = category_of_name.try_emplace(k.name, KernelCategory::other);
    if (inserted) it->second = classify_kernel(k.name);
    add(attribution.kernel_range[i], k.start, k.end, it->second, true);
  }
  for (size_t i = 0; i < trace.memcpys.size(); ++i) {
    if (attribution.memcpy_range[i] != kNoRange)
      add(attribution.memcpy_range[i], trace.memcpys[i].start, trace.memcpys[i].end, KernelCategory::copy, false);
  }
  for (size_t i = 0; i < trace.memsets.size(); ++i) {
    if (attribution.memset_range[i] != kNoRange)
      add(attribution.memset_range[i], trace.memsets[i].start, trace.memsets[i].end, KernelCategory::copy, false);
  }

  // Pre-order: a path before the paths nested in it, siblings by their first start. Paths are
  // compared at their first differing name by the rows of their prefixes up to it.
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& rows = nested[i];
    auto sibling_key = [&](const std::vector<std::string>& path, size_t depth) {
      const NestedRangeTime& row = rows.at(std::vector<std::string>(path.begin(), path.begin() + depth + 1));
      return std::make_pair(row.first_start, path[depth]);
    };
    for (const auto& [path, row] : rows) out[i].nested.push_back(row);
    std::sort(out[i].nested.begin(), out[i].nested.end(), [&](const NestedRangeTime& a, const NestedRangeTime& b) {
      size_t d = 0;
      while (d < a.path.size() && d < b.path.size() && a.path[d] == b.path[d]) ++d;
      if (d == a.path.size() || d == b.path.size()) return a.path.size() < b.path.size();
      return sibling_key(a.path, d) < sibling_key(b.path, d);
    });
  }
  return out;
}

}  // namespace fusekit::profiler
