#include "reports/case_kernels.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace fusekit::reports {

std::map<std::pair<std::string, std::string>, VariantKernels> case_kernels(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases) {
  using Key = std::pair<std::string, std::string>;
  std::unordered_map<std::string, const Key*> by_range_name;
  for (const Key& key : cases) by_range_name.emplace(key.first + " [" + key.second + "]", &key);

  // Per range: the case whose range it is or is nested in, found once per range.
  constexpr int kUnknown = -2;
  std::vector<int> case_range(trace.ranges.size(), kUnknown);  // index of the case's range, or kNoRange
  const auto owner = [&](int range) {
    std::vector<int> path;
    int found = profiler::kNoRange;
    for (int r = range; r != profiler::kNoRange; r = attribution.range_parent[r]) {
      if (case_range[r] != kUnknown) {
        found = case_range[r];
        break;
      }
      path.push_back(r);
      if (by_range_name.count(trace.ranges[r].text)) {
        found = r;
        break;
      }
    }
    for (int r : path) case_range[r] = found;
    return found;
  };

  // The case ranges of each process by start, for kernels launched on another thread (below).
  std::map<uint32_t, std::vector<int>> case_ranges;
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    if (by_range_name.count(trace.ranges[r].text))
      case_ranges[trace.ranges[r].process_id].push_back(static_cast<int>(r));
  }
  for (auto& [process, ranges] : case_ranges) {
    std::sort(ranges.begin(), ranges.end(),
              [&](int a, int b) { return trace.ranges[a].start < trace.ranges[b].start; });
  }
  std::unordered_map<uint64_t, uint64_t> launch_time;  // (process, correlation id) -> the launch call's start
  const auto launch_key = [](uint32_t process, uint32_t correlation) {
    return (static_cast<uint64_t>(process) << 32) | correlation;
  };
  if (!case_ranges.empty()) {
    for (const profiler::ApiRecord& a : trace.api_calls)
      launch_time.emplace(launch_key(a.process_id, a.correlation_id), a.start);
  }
  // The case range of the kernel's process that was open when it was launched, or kNoRange.
  const auto open_case = [&](const profiler::KernelRecord& k) {
    const auto ranges = case_ranges.find(k.process_id);
    const auto launched = launch_time.find(launch_key(k.process_id, k.correlation_id));
    if (ranges == case_ranges.end() || launched == launch_time.end()) return profiler::kNoRange;
    const uint64_t t = launched->second;
    const std::vector<int>& list = ranges->second;
    auto after = std::upper_bound(list.begin(), list.end(), t,
                                  [&](uint64_t time, int r) { return time < trace.ranges[r].start; });
    if (after == list.begin()) return profiler::kNoRange;
    const profiler::RangeRecord& range = trace.ranges[*(after - 1)];
    return range.end == 0 || t < range.end ? *(after - 1) : profiler::kNoRange;
  };

  std::map<Key, VariantKernels> out;
  std::map<Key, std::map<std::string, KernelTime>> kernels;
  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    const int range = attribution.kernel_range[i];
    int c = range == profiler::kNoRange ? profiler::kNoRange : owner(range);
    // A kernel launched by another thread of the process while a case's range was open belongs to that
    // case: the runner and the peers run one case at a time, and autograd launches the backward pass from
    // its own device threads, outside the range that the main thread opened.
    if (c == profiler::kNoRange) c = open_case(trace.kernels[i]);
    if (c == profiler::kNoRange) continue;
    const Key& key = *by_range_name.at(trace.ranges[c].text);
    const profiler::KernelRecord& k = trace.kernels[i];
    const uint64_t duration = k.end > k.start ? k.end - k.start : 0;
    VariantKernels& v = out[key];
    v.kernel_ns += duration;
    ++v.launches;
    KernelTime& t = kernels[key][k.name];
    t.total_ns += duration;
    ++t.instances;
  }
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    if (trace.ranges[r].text != "rep" || attribution.range_parent[r] == profiler::kNoRange) continue;
    const int c = owner(attribution.range_parent[r]);
    if (c != profiler::kNoRange) ++out[*by_range_name.at(trace.ranges[c].text)].repetitions;
  }
  for (auto& [key, by_name] : kernels) {
    std::vector<KernelTime>& list = out[key].kernels;
    for (auto& [name, t] : by_name) {
      t.name = name;
      list.push_back(std::move(t));
    }
    std::sort(list.begin(), list.end(), [](const KernelTime& a, const KernelTime& b) {
      return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
    });
  }
  return out;
}

namespace {

// case_repetition_kernels and case_repetition_ranges: the samples of kernel i, of repetition `rep`,
// go to key_of(i, rep).
template <typename KeyOf>
std::map<std::pair<std::string, std::string>, RepetitionKernels> repetition_samples(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases, const KeyOf& key_of) {
  using Key = std::pair<std::string, std::string>;
  std::unordered_map<std::string, const Key*> by_range_name;
  for (const Key& key : cases) by_range_name.emplace(key.first + " [" + key.second + "]", &key);

  // Per range: the innermost "rep" range it is or is nested in, if that lies inside a case's range; else
  // kNoRange. Found by walking up the parents, once per range.
  constexpr int kUnknown = -2;
  std::vector<int> rep_of(trace.ranges.size(), kUnknown);
  std::vector<const Key*> case_of_rep(trace.ranges.size(), nullptr);
  const auto find_rep = [&](int range) {
    if (rep_of[range] != kUnknown) return rep_of[range];
    int rep = profiler::kNoRange;
    for (int r = range; r != profiler::kNoRange; r = attribution.range_parent[r]) {
      const auto found = by_range_name.find(trace.ranges[r].text);
      if (found != by_range_name.end()) {
        if (rep != profiler::kNoRange) case_of_rep[rep] = found->second;
        break;
      }
      if (rep == profiler::kNoRange && trace.ranges[r].text == "rep") rep = r;
    }
    if (rep != profiler::kNoRange && case_of_rep[rep] == nullptr) rep = profiler::kNoRange;  // in no case
    rep_of[range] = rep;
    return rep;
  };

  // The repetitions of each case in start order, numbered; and of each process, by start, for kernels
  // launched on another thread.
  std::vector<int> reps;
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    if (trace.ranges[r].text == "rep" && find_rep(static_cast<int>(r)) == static_cast<int>(r))
      reps.push_back(static_cast<int>(r));
  }
  std::sort(reps.begin(), reps.end(), [&](int a, int b) { return trace.ranges[a].start < trace.ranges[b].start; });
  std::map<Key, RepetitionKernels> out;
  std::vector<size_t> ordinal(trace.ranges.size(), 0);
  std::map<uint32_t, std::vector<int>> reps_of_process;
  for (int r : reps) {
    ordinal[r] = out[*case_of_rep[r]].repetitions++;
    reps_of_process[trace.ranges[r].process_id].push_back(r);
  }
  std::unordered_map<uint64_t, uint64_t> launch_time;  // (process, correlation id) -> the launch call's start
  const auto launch_key = [](uint32_t process, uint32_t correlation) {
    return (static_cast<uint64_t>(process) << 32) | correlation;
  };
  if (!reps.empty()) {
    for (const profiler::ApiRecord& a : trace.api_calls)
      launch_time.emplace(launch_key(a.process_id, a.correlation_id), a.start);
  }
  const auto open_rep = [&](const profiler::KernelRecord& k) {
    const auto list = reps_of_process.find(k.process_id);
    const auto launched = launch_time.find(launch_key(k.process_id, k.correlation_id));
    if (list == reps_of_process.end() || launched == launch_time.end()) return profiler::kNoRange;
    const uint64_t t = launched->second;
    auto after = std::upper_bound(list->second.begin(), list->second.end(), t,
                                  [&](uint64_t time, int r) { return time < trace.ranges[r].start; });
    if (after == list->second.begin()) return profiler::kNoRange;
    const profiler::RangeRecord& range = trace.ranges[*(after - 1)];
    return range.end == 0 || t < range.end ? *(after - 1) : profiler::kNoRange;
  };

  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    const int range = attribution.kernel_range[i];
    int rep = range == profiler::kNoRange ? profiler::kNoRange : find_rep(range);
    if (rep == profiler::kNoRange) rep = open_rep(trace.kernels[i]);
    if (rep == profiler::kNoRange) continue;
    const profiler::KernelRecord& k = trace.kernels[i];
    RepetitionKernels& c = out[*case_of_rep[rep]];
    std::vector<double>& samples = c.samples_ns[key_of(i, rep)];
    samples.resize(c.repetitions, 0.0);
    samples[ordinal[rep]] += static_cast<double>(k.end > k.start ? k.end - k.start : 0);
  }
  return out;
}

}  // namespace

std::map<std::pair<std::string, std::string>, RepetitionKernels> case_repetition_kernels(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases) {
  return repetition_samples(trace, attribution, cases, [&](size_t i, int) { return trace.kernels[i].name; });
}

std::map<std::pair<std::string, std::string>, RepetitionKernels> case_repetition_ranges(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases, int depth) {
  return repetition_samples(trace, attribution, cases, [&](size_t i, int rep) {
    // The names from the kernel's range up to (not including) the repetition's "rep" range.
    std::vector<const std::string*> path;
    const int range = attribution.kernel_range[i];
    bool inside = false;
    for (int r = range; r != profiler::kNoRange; r = attribution.range_parent[r]) {
      if (r == rep) {
        inside = true;
        break;
      }
      path.push_back(&trace.ranges[r].text);
    }
    if (!inside || path.empty()) return std::string("(rep)");
    std::string key;
    for (int n = 0; n < depth && n < static_cast<int>(path.size()); ++n) {
      key += (n ? " / " : "") + *path[path.size() - 1 - n];
    }
    return key;
  });
}

}  // namespace fusekit::reports
