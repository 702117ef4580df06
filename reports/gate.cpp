#include "reports/gate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "profiler/gpu_conditions.h"
#include "profiler/summary.h"

namespace fusekit::reports {
namespace {
constexpr size_t kExactMaxSampleSize = 50;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
__extension__ using ArrangementCount = __int128;  // a GCC and Clang extension

// How many of the C(m+n, m) orderings of two tie-free samples of sizes m and n give U = u, for u in [0, m n]:
// the coefficients of the Gaussian binomial [m+n choose m]_q, built as the product over j = 1..m of
// (1 - q^(n+j)) / (1 - q^j). Each partial product is again a Gaussian binomial, so every division is exact
// and the arithmetic stays in integers: coefficients stay below 2 C(100, 50) < 2^98 for m, n <= 50.
std::vector<ArrangementCount> u_distribution_counts(size_t m, size_t n) {
  if (m > n) std::swap(m, n);
  const size_t degree = m * n;
  std::vector<ArrangementCount> counts(degree + 1, 0);
  counts[0] = 1;
  for (size_t j = 1; j <= m; ++j) {
    for (size_t k = degree; k >= n + j; --k) counts[k] -= counts[k - n - j];
    for (size_t k = j; k <= degree; ++k) counts[k] += counts[k - j];
  }
  return counts;
}

// P(U <= k) under the null hypothesis.
double exact_lower_tail(size_t m, size_t n, size_t k) {
  const std::vector<ArrangementCount> counts = u_distribution_counts(m, n);
  ArrangementCount below = 0, total = 0;
  for (size_t u = 0; u < counts.size(); ++u) {
    total += counts[u];
    if (u <= k) below += counts[u];
  }
  return static_cast<double>(below) / static_cast<double>(total);
}

}  // namespace

MannWhitneyResult mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || b.empty()) {
    throw std::invalid_argument("mann_whitney_u: empty sample (sizes " + std::to_string(a.size()) + " and " +
                                std::to_string(b.size()) + ")");
  }
  std::vector<std::pair<double, bool>> pooled;  // (value, from a)
  pooled.reserve(a.size() + b.size());
  for (double x : a) pooled.emplace_back(x, true);
  for (double x : b) pooled.emplace_back(x, false);
  for (const auto& [x, from_a] : pooled) {
    if (std::isnan(x)) throw std::invalid_argument("mann_whitney_u: NaN in a sample");
  }
  std::sort(pooled.begin(), pooled.end());

  double rank_sum_a = 0;
  double tie_term = 0;  // sum of t^3 - t over groups of t equal values
  for (size_t first = 0; first < pooled.size();) {
    size_t last = first;
    while (last < pooled.size() && pooled[last].first == pooled[first].first) ++last;
    const double tied = static_cast<double>(last - first);
    const double average_rank = (static_cast<double>(first + 1) + static_cast<double>(last)) / 2;
    for (size_t i = first; i < last; ++i) rank_sum_a += pooled[i].second ? average_rank : 0;
    tie_term += tied * tied * tied - tied;
    first = last;
  }

  const double n1 = static_cast<double>(a.size()), n2 = static_cast<double>(b.size());
  MannWhitneyResult result;
  result.u = rank_sum_a - n1 * (n1 + 1) / 2;
  const double u_larger = std::max(result.u, n1 * n2 - result.u);

  if (tie_term == 0 && a.size() <= kExactMaxSampleSize && b.size() <= kExactMaxSampleSize) {
    const auto u_smaller = static_cast<size_t>(std::llround(n1 * n2 - u_larger));
    result.p_value = std::min(1.0, 2 * exact_lower_tail(a.size(), b.size(), u_smaller));
    return result;
  }
  const double n = n1 + n2;
  const double sigma = std::sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))));
  if (sigma == 0) {  // every value is the same
    result.p_value = 1;
    return result;
  }
  const double z = (u_larger - n1 * n2 / 2 - 0.5) / sigma;
  result.p_value = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return result;
}

std::vector<CaseResult> pool_case_results(const std::vector<std::vector<CaseResult>>& runs) {
  std::vector<CaseResult> pooled;
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const std::vector<CaseResult>& run : runs) {
    for (const CaseResult& c : run) {
      const auto key = std::make_pair(c.info.name, c.info.variant);
      const auto [it, inserted] = index.emplace(key, pooled.size());
      if (inserted) {
        pooled.push_back(c);
        continue;
      }
      CaseResult& into = pooled[it->second];
      std::vector<double> samples = std::move(into.samples_ns);
      samples.insert(samples.end(), c.samples_ns.begin(), c.samples_ns.end());
      into = c;  // the newest run's info, metrics and derived numbers
      into.samples_ns = std::move(samples);
    }
  }
  for (CaseResult& c : pooled) {
    if (c.samples_ns.empty()) continue;
    const double median = quantile(c.samples_ns, 0.5);
    if (c.bandwidth_bytes_per_s) *c.bandwidth_bytes_per_s *= c.median_ns / median;
    if (c.flops_per_s) *c.flops_per_s *= c.median_ns / median;
    c.median_ns = median;
    c.q1_ns = quantile(c.samples_ns, 0.25);
    c.q3_ns = quantile(c.samples_ns, 0.75);
    c.min_ns = quantile(c.samples_ns, 0.0);
    c.max_ns = quantile(c.samples_ns, 1.0);
  }
  return pooled;
}

std::vector<int64_t> history_runs(const std::vector<store::RunInfo>& runs, const std::string& gpu_name, size_t count,
                                  int64_t exclude) {
  std::vector<int64_t> chosen;
  for (auto it = runs.rbegin(); it != runs.rend() && chosen.size() < count; ++it) {
    if (it->id != exclude && it->status == "ok" && it->gpu_name == gpu_name) chosen.push_back(it->id);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

int64_t run_of_commit(const std::vector<store::RunInfo>& runs, const std::string& commit) {
  const bool hex =
      std::all_of(commit.begin(), commit.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  if (commit.size() < 7 || commit.size() > 40 || !hex) {
    throw std::invalid_argument("a commit is 7 to 40 hexadecimal digits, not '" + commit + "'");
  }
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    if (it->status == "ok" && it->git_commit.compare(0, commit.size(), commit) == 0) return it->id;
  }
  return 0;
}

namespace {

// The median over `cases` of metric `name`, or nullopt where no case has it.
std::optional<double> median_metric(const std::vector<const CaseResult*>& cases, const std::string& name) {
  std::vector<double> values;
  for (const CaseResult* c : cases) {
    if (const auto v = case_metric(*c, name)) values.push_back(*v);
  }
  if (values.empty()) return std::nullopt;
  return quantile(values, 0.5);
}

std::optional<double> max_metric(const std::vector<const CaseResult*>& cases, const std::string& name) {
  std::optional<double> most;
  for (const CaseResult* c : cases) {
    if (const auto v = case_metric(*c, name)) most = std::max(most.value_or(*v), *v);
  }
  return most;
}

// The throttling reasons of a case, at the start or end of its timed repetitions.
uint64_t throttling_of(const CaseResult& c) {
  uint64_t reasons = 0;
  for (const char* point : {"start", "end"}) {
    if (const auto v = case_metric(c, std::string("gpu.clocks_event_reasons.") + point)) {
      reasons |= static_cast<uint64_t>(*v);
    }
  }
  return reasons & profiler::clocks_event::throttling;
}

std::string number(double v, int decimals = 0) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, v);
  return buffer;
}

}  // namespace

void check_gpu_conditions(GateResult& result, const std::vector<CaseResult>& baseline,
                          const std::vector<CaseResult>& candidate) {
  std::map<std::pair<std::string, std::string>, const CaseResult*> baseline_by_key;
  for (const CaseResult& c : baseline) baseline_by_key[{c.info.name, c.info.variant}] = &c;
  std::vector<const CaseResult*> base, cand;
  for (const CaseResult& c : candidate) {
    const auto it = baseline_by_key.find({c.info.name, c.info.variant});
    if (it == baseline_by_key.end()) continue;
    base.push_back(it->second);
    cand.push_back(&c);
    std::string sides;
    for (const auto& [side, which] : {std::pair{"baseline", it->second}, {"candidate", &c}}) {
      if (const uint64_t reasons = throttling_of(*which)) {
        sides += (sides.empty() ? "" : ", ") + std::string(side) + " (" + profiler::clocks_event_names(reasons) + ")";
      }
    }
    if (!sides.empty()) result.throttled_cases.push_back(c.info.name + " [" + c.info.variant + "]: " + sides);
  }
  const auto compare = [&](const std::string& metric, const char* what, const char* unit, double limit, bool relative) {
    const auto b = median_metric(base, metric), c = median_metric(cand, metric);
    if (!b || !c) return;
    const double apart = relative ? std::fabs(*c / *b - 1) : std::fabs(*c - *b);
    if (!(apart > limit)) return;
    result.condition_warnings.push_back(std::string(what) + ": baseline " + number(*b) + " " + unit + ", candidate " +
                                        number(*c) + " " + unit +
                                        " (median over the cases, at the end of their timing)");
  };
  compare("gpu.sm_clock_mhz.end", "SM clock", "MHz", 0.05, true);
  compare("gpu.memory_clock_mhz.end", "memory clock", "MHz", 0.02, true);
  compare("gpu.temperature_c.end", "temperature", "C", 15, false);
  for (const auto& [side, cases] : {std::pair{"baseline", &base}, {"candidate", &cand}}) {
    const auto others = max_metric(*cases, "gpu.other_processes.end");
    const auto others_start = max_metric(*cases, "gpu.other_processes.start");
    const double most = std::max(others.value_or(0), others_start.value_or(0));
    if (most > 0) {
      result.condition_warnings.push_back(std::string("other processes on the GPU during the ") + side +
                                          "'s timing: up to " + number(most));
    }
  }
  const bool base_has = median_metric(base, "gpu.sm_clock_mhz.end").has_value();
  const bool cand_has = median_metric(cand, "gpu.sm_clock_mhz.end").has_value();
  if (base_has != cand_has && !base.empty()) {
    result.condition_warnings.push_back(std::string("GPU conditions were recorded for the ") +
                                        (base_has ? "baseline" : "candidate") + " only: they cannot be compared");
  }
  if (!result.throttled_cases.empty()) {
    result.condition_warnings.push_back(std::to_string(result.throttled_cases.size()) +
                                        " case(s) timed while a GPU throttled (listed below the table)");
  }
}

bool GateResult::any_regression() const {
  return std::any_of(rows.begin(), rows.end(), [](const GateRow& r) { return r.fails(); });
}

bool is_fusekit_variant(const std::string& variant) { return variant == "fused" || variant.rfind("fused:", 0) == 0; }

SampleTest test_samples(const std::vector<double>& baseline, const std::vector<double>& candidate,
                        const GateOptions& options) {
  const size_t min_samples = std::max<size_t>(options.min_samples, 1);
  SampleTest test;
  const double base_median = baseline.empty() ? kNaN : profiler::median(baseline);
  const double cand_median = candidate.empty() ? kNaN : profiler::median(candidate);
  test.change = base_median == 0 ? (cand_median > 0 ? std::numeric_limits<double>::infinity() : 0)
                                 : cand_median / base_median - 1;
  if (baseline.size() < min_samples || candidate.size() < min_samples) {
    test.p_value = kNaN;
    test.verdict = Verdict::too_few_samples;
    return test;
  }
  test.p_value = mann_whitney_u(baseline, candidate).p_value;
  const bool significant = test.p_value < options.alpha;
  test.verdict = significant && test.change > options.threshold    ? Verdict::regressed
                 : significant && test.change < -options.threshold ? Verdict::improved
                                                                   : Verdict::unchanged;
  return test;
}

GateResult run_gate(const std::vector<CaseResult>& baseline, const std::vector<CaseResult>& candidate,
                    const GateOptions& options) {
  if (!(options.threshold >= 0)) throw std::invalid_argument("run_gate: threshold must be >= 0");
  if (!(options.alpha > 0 && options.alpha <= 1)) throw std::invalid_argument("run_gate: alpha must be in (0, 1]");
  const auto baseline_index = index_cases(baseline, "baseline");
  const auto candidate_index = index_cases(candidate, "candidate");

  std::set<std::string> candidate_ops, candidate_variants;
  for (const CaseResult& cand : candidate) {
    candidate_ops.insert(cand.info.op);
    candidate_variants.insert(cand.info.variant);
  }
  GateResult result;
  for (const CaseResult& base : baseline) {
    const CaseKey key{base.info.name, base.info.variant};
    auto found = candidate_index.find(key);
    if (found == candidate_index.end()) {
      if (!base.info.op.empty() && !candidate_ops.count(base.info.op)) {
        ++result.unmeasured_operators[base.info.op];
      } else if (!candidate_variants.count(base.info.variant) && !is_fusekit_variant(base.info.variant)) {
        ++result.unmeasured_variants[base.info.variant];
      } else {
        result.only_in_baseline.push_back(describe(key));
      }
      continue;
    }
    const CaseResult& cand = *found->second;
    GateRow row;
    row.name = key.first;
    row.variant = key.second;
    row.baseline_n = base.samples_ns.size();
    row.candidate_n = cand.samples_ns.size();
    row.baseline_median_ns = profiler::median(base.samples_ns);
    row.candidate_median_ns = profiler::median(cand.samples_ns);
    const SampleTest test = test_samples(base.samples_ns, cand.samples_ns, options);
    row.change = test.change;
    row.p_value = test.p_value;
    row.verdict = test.verdict;
    row.gated = options.gate_every_variant || is_fusekit_variant(row.variant);
    result.rows.push_back(std::move(row));
  }
  for (const CaseResult& cand : candidate) {
    const CaseKey key{cand.info.name, cand.info.variant};
    if (!baseline_index.count(key)) result.only_in_candidate.push_back(describe(key));
  }
  check_gpu_conditions(result, baseline, candidate);
  return result;
}

std::vector<CaseKernelGate> gate_kernels(const GateResult& result, const std::map<CaseKey, RepetitionKernels>& baseline,
                                         const std::map<CaseKey, RepetitionKernels>& candidate,
                                         const GateOptions& options) {
  const RepetitionKernels none;
  const auto find = [&](const std::map<CaseKey, RepetitionKernels>& in,
                        const CaseKey& key) -> const RepetitionKernels& {
    const auto found = in.find(key);
    return found == in.end() ? none : found->second;
  };
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  std::vector<CaseKernelGate> out;
  for (const GateRow& row : result.rows) {
    const CaseKey key{row.name, row.variant};
    const RepetitionKernels& base = find(baseline, key);
    const RepetitionKernels& cand = find(candidate, key);
    CaseKernelGate gate;
    gate.name = row.name;
    gate.variant = row.variant;
    gate.baseline_repetitions = base.repetitions;
    gate.candidate_repetitions = cand.repetitions;
    if (base.repetitions > 0 && cand.repetitions > 0) {
      std::set<std::string> names;
      for (const auto& [name, samples] : base.samples_ns) names.insert(name);
      for (const auto& [name, samples] : cand.samples_ns) names.insert(name);
      for (const std::string& name : names) {
        const auto samples = [&](const RepetitionKernels& k) {
          const auto found = k.samples_ns.find(name);
          std::vector<double> v = found == k.samples_ns.end() ? std::vector<double>{} : found->second;
          v.resize(k.repetitions, 0.0);
          return v;
        };
        const std::vector<double> b = samples(base), c = samples(cand);
        KernelGateRow k;
        k.kernel = name;
        k.baseline_n = b.size();
        k.candidate_n = c.size();
        k.baseline_median_ns = profiler::median(b);
        k.candidate_median_ns = profiler::median(c);
        k.baseline_mean_ns = mean(b);
        k.candidate_mean_ns = mean(c);
        const SampleTest test = test_samples(b, c, options);
        k.change = test.change;
        k.p_value = test.p_value;
        k.verdict = test.verdict;
        gate.rows.push_back(std::move(k));
      }
      std::sort(gate.rows.begin(), gate.rows.end(), [](const KernelGateRow& a, const KernelGateRow& b) {
        const double ma = std::abs(a.moved_ns()), mb = std::abs(b.moved_ns());
        return ma != mb ? ma > mb : a.kernel < b.kernel;
      });
    }
    out.push_back(std::move(gate));
  }
  return out;
}

std::string verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::regressed:
      return "regressed";
    case Verdict::improved:
      return "improved";
    case Verdict::unchanged:
      return "unchanged";
    case Verdict::too_few_samples:
      return "too few samples";
  }
  throw std::invalid_argument("verdict_name: unknown verdict " + std::to_string(static_cast<int>(verdict)));
}

}  // namespace fusekit::reports
