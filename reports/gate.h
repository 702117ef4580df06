// The regression gate: does a candidate run time any case slower than a baseline run?
//
// A case regresses only when two things hold at once: the Mann-Whitney U test says the two sample sets
// differ (p < alpha) and the median slowed down by more than a threshold. The test alone flags tiny but
// consistent shifts on quiet machines; the threshold alone flags noise. Medians come from the samples,
// not from the stored median_ns.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "reports/run_report.h"

namespace fusekit::reports {

struct MannWhitneyResult {
  double u = 0;        // U of the first sample: how many (a, b) pairs have a > b, ties counting one half
  double p_value = 1;  // two-sided
};

// Two-sided Mann-Whitney U test, as scipy.stats.mannwhitneyu(a, b, method='auto') computes it except
// for the switch point: the exact distribution of U when there are no ties and both samples have at
// most 50 values; otherwise the normal approximation with tie and continuity corrections.
MannWhitneyResult mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b);

struct GateOptions {
  double threshold = 0.05;  // minimum relative slowdown of the medians
  double alpha = 0.01;
  size_t min_samples = 5;
};

enum class Verdict { regressed, improved, unchanged, too_few_samples };

struct GateRow {
  std::string name;
  std::string variant;
  size_t baseline_n = 0, candidate_n = 0;
  double baseline_median_ns = 0, candidate_median_ns = 0;
  double change = 0;   // candidate / baseline - 1
  double p_value = 1;  // NaN for too_few_samples
  Verdict verdict = Verdict::unchanged;
};

struct GateResult {
  std::vector<GateRow> rows;                  // in the order of the baseline
  std::vector<std::string> only_in_baseline;  // "name [variant]"
  std::vector<std::string> only_in_candidate;
  bool any_regression() const;
};

// Matches cases by (info.name, info.variant).
GateResult run_gate(const std::vector<CaseResult>& baseline, const std::vector<CaseResult>& candidate,
                    const GateOptions& options);

std::string verdict_name(Verdict verdict);

// The gate's tables are written by the writers: gate_table_text (reports/terminal.h) and
// gate_table_markdown (reports/markdown.h).

}  // namespace fusekit::reports
