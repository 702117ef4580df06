#include "reports/run_report.h"

#include <cctype>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace fusekit::reports {

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double position = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, values.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return values[below] + fraction * (values[above] - values[below]);
}

std::vector<CaseResult> load_case_results(const store::Store& store, int64_t run) {
  std::vector<CaseResult> cases;
  for (store::StoredCase& stored : store.load_cases(run)) {
    CaseResult c;
    c.id = stored.id;
    c.info = std::move(stored.info);
    c.samples_ns = std::move(stored.samples_ns);
    c.metrics = std::move(stored.metrics);
    cases.push_back(std::move(c));
  }
  derive_case_statistics(cases, store.run(run).copy_ceiling_bytes_per_second);
  return cases;
}

std::optional<double> case_metric(const CaseResult& c, const std::string& name) {
  for (const store::CaseMetric& m : c.metrics) {
    if (m.name == name) return m.value;
  }
  return std::nullopt;
}

std::optional<int64_t> step_batch(const store::CaseInfo& info) {
  const std::string suffix = "_step";
  if (info.op.size() < suffix.size() || info.op.compare(info.op.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  for (size_t at = info.shape.find(':'); at != std::string::npos; at = info.shape.find(':', at + 1)) {
    if (at + 2 > info.shape.size() || info.shape[at + 1] != 'b') continue;
    size_t end = at + 2;
    while (end < info.shape.size() && std::isdigit(static_cast<unsigned char>(info.shape[end]))) ++end;
    if (end == at + 2 || (end < info.shape.size() && info.shape[end] != ':') || end - at - 2 > 9) continue;
    const int64_t batch = std::stoll(info.shape.substr(at + 2, end - at - 2));
    if (batch > 0) return batch;
  }
  return std::nullopt;
}

std::optional<double> items_per_second(const CaseResult& c) {
  const std::optional<int64_t> batch = step_batch(c.info);
  if (!batch || !(c.median_ns > 0)) return std::nullopt;
  return static_cast<double>(*batch) * 1e9 / c.median_ns;
}

std::optional<double> peak_memory_mib(const CaseResult& c) {
  const std::optional<double> bytes = case_metric(c, "peak_memory_bytes");
  return bytes ? std::optional<double>(*bytes / (1 << 20)) : std::nullopt;
}

RunReport load_run_report(const store::Store& store, int64_t run, const ReportOptions& options) {
  using profiler::RangeProjection;
  RunReport report;
  report.run = store.run(run);
  report.cases = load_case_results(store, run);
  const profiler::Trace trace = store.load_trace(run);
  report.range_projection =
      options.projection.value_or(is_training_step_run(report.run) ? RangeProjection::unranged : RangeProjection::none);
  report.breakdown_projection =
      options.projection == RangeProjection::all ? RangeProjection::all : RangeProjection::unranged;
  const profiler::Attribution attribution = profiler::attribute(trace, report.range_projection);
  report.kernels = profiler::summarize_kernels(trace, attribution);
  report.ranges = profiler::summarize_ranges(trace, attribution);
  report.totals = profiler::summarize_run(trace);
  if (!report.cases.empty()) {
    report.case_breakdowns =
        report.breakdown_projection == report.range_projection
            ? break_down_cases(trace, attribution, report.cases)
            : break_down_cases(trace, profiler::attribute(trace, report.breakdown_projection), report.cases);
  }
  std::set<CaseKey> keys;
  for (const CaseResult& c : report.cases) keys.emplace(c.info.name, c.info.variant);
  report.case_kernels = case_kernels(trace, attribution, keys);
  return report;
}

std::vector<CaseBreakdown> break_down_cases(const profiler::Trace& trace, const profiler::Attribution& attribution,
                                            const std::vector<CaseResult>& cases) {
  std::vector<std::string> names;
  for (const CaseResult& c : cases) names.push_back(describe({c.info.name, c.info.variant}));
  std::vector<profiler::RangeBreakdown> breakdowns = profiler::break_down_ranges(trace, attribution, names);
  // Grouped by case name, in the order the names first come; the variants in the cases' order.
  std::vector<std::string> order;
  for (const CaseResult& c : cases) {
    if (std::find(order.begin(), order.end(), c.info.name) == order.end()) order.push_back(c.info.name);
  }
  std::vector<CaseBreakdown> out;
  for (const std::string& name : order) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].info.name != name || breakdowns[i].gpu_ns == 0) continue;
      out.push_back({cases[i].info.name, cases[i].info.variant, std::move(breakdowns[i])});
    }
  }
  return out;
}

std::string describe(const CaseKey& key) { return key.first + " [" + key.second + "]"; }

std::map<CaseKey, const CaseResult*> index_cases(const std::vector<CaseResult>& cases, const std::string& which) {
  std::map<CaseKey, const CaseResult*> index;
  for (const CaseResult& c : cases) {
    const CaseKey key{c.info.name, c.info.variant};
    if (!index.emplace(key, &c).second)
      throw std::invalid_argument("duplicate case in " + which + ": " + describe(key));
  }
  return index;
}

void derive_case_statistics(std::vector<CaseResult>& cases, double copy_ceiling_bytes_per_second) {
  for (CaseResult& c : cases) {
    c.median_ns = quantile(c.samples_ns, 0.5);
    c.q1_ns = quantile(c.samples_ns, 0.25);
    c.q3_ns = quantile(c.samples_ns, 0.75);
    c.min_ns = quantile(c.samples_ns, 0.0);
    c.max_ns = quantile(c.samples_ns, 1.0);
    c.speedup.reset();
    c.bandwidth_bytes_per_s.reset();
    c.bandwidth_percent.reset();
    c.flops_per_s.reset();
    if (!(c.median_ns > 0)) continue;
    if (c.info.bytes > 0) {
      c.bandwidth_bytes_per_s = c.info.bytes / (c.median_ns * 1e-9);
      if (copy_ceiling_bytes_per_second > 0)
        c.bandwidth_percent = 100.0 * *c.bandwidth_bytes_per_s / copy_ceiling_bytes_per_second;
    }
    if (c.info.flops > 0) c.flops_per_s = c.info.flops / (c.median_ns * 1e-9);
  }
  std::map<std::string, double> baseline_median;
  for (const CaseResult& c : cases) {
    if (c.info.variant == "baseline" && c.median_ns > 0) baseline_median[c.info.name] = c.median_ns;
  }
  for (CaseResult& c : cases) {
    auto it = baseline_median.find(c.info.name);
    if (it != baseline_median.end() && c.median_ns > 0) c.speedup = it->second / c.median_ns;
  }
}

namespace {

// The word after `flag` in `words` ("--suite ops"), or "" if absent.
std::string value_of(const std::vector<std::string>& words, const std::string& flag) {
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == flag) return words[i + 1];
  }
  return "";
}

// What the recorded command line ran: "ops suite", "layernorm 16384x1024 bf16", "trace of python3
// train.py"; "" where it says nothing known.
std::string what_ran(const RunInfo& run) {
  std::vector<std::string> words;
  std::istringstream in(run.command_line);
  for (std::string w; in >> w;) words.push_back(w);
  // The program by its name (older stores recorded a path to it).
  if (words.size() < 2 || words[0].substr(words[0].find_last_of('/') + 1) != "fusekit") return "";
  if (words[1] == "bench") {
    const std::string op = value_of(words, "--op");
    if (!op.empty()) {
      std::string what = op + " " + value_of(words, "--shape") + " " + value_of(words, "--dtype");
      return std::find(words.begin(), words.end(), "--backward") != words.end() ? what + " fwd+bwd" : what;
    }
    const std::string suite = value_of(words, "--suite");
    return (suite.empty() ? "demo" : suite) + " suite";
  }
  if (words[1] == "trace") {
    const auto dashes = std::find(words.begin(), words.end(), "--");
    std::string command;
    for (auto w = dashes == words.end() ? dashes : dashes + 1; w != words.end(); ++w)
      command += (command.empty() ? "" : " ") + *w;
    return command.empty() ? "trace" : "trace of " + command;
  }
  return "";
}

}  // namespace

bool is_training_step_run(const RunInfo& run) {
  std::vector<std::string> words;
  std::istringstream in(run.command_line);
  for (std::string w; in >> w;) words.push_back(w);
  return value_of(words, "--suite") == "models";
}

std::string run_title(const RunInfo& run) {
  std::string what = what_ran(run);
  if (what.empty()) what = run.label.empty() ? "run" : run.label;
  std::string title = "fusekit " + what;
  if (!run.gpu_name.empty()) title += " on " + run.gpu_name;
  if (!run.git_commit.empty()) title += " at " + run.git_commit.substr(0, 7);
  return title + " (run " + std::to_string(run.id) + ")";
}

}  // namespace fusekit::reports
