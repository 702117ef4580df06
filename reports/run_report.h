// What the store knows about one run, in the shape the writers need.
//
// The store holds raw records; a RunReport is computed from them on read (case statistics here,
// attribution and summaries from profiler/), so every writer shows the same numbers and none of
// them queries SQL.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "profiler/records.h"
#include "profiler/summary.h"
#include "reports/case_kernels.h"
#include "store/run_records.h"
#include "store/store.h"

namespace fusekit::reports {

// The store's records, by the names the writers use.
using store::CaseInfo;
using store::RunInfo;

// A stored case with the statistics derived from its samples.
struct CaseResult {
  int64_t id = 0;
  CaseInfo info;
  std::vector<double> samples_ns;  // every timed repetition, in order
  double median_ns = 0;
  double q1_ns = 0;  // quartiles: the spread
  double q3_ns = 0;
  double min_ns = 0;
  double max_ns = 0;
  std::optional<double> speedup;                // baseline median / this median, same name
  std::optional<double> bandwidth_bytes_per_s;  // bytes / median
  std::optional<double> bandwidth_percent;      // of the run's copy ceiling
  std::optional<double> flops_per_s;
};

struct RunReport {
  RunInfo run;
  std::vector<CaseResult> cases;
  std::vector<profiler::KernelStats> kernels;
  std::vector<profiler::RangeStats> ranges;
  profiler::RunTotals totals;
  // Per (case name, variant): the kernels of the case's traced repetitions (reports/case_kernels.h).
  std::map<std::pair<std::string, std::string>, VariantKernels> case_kernels;
};

// The run's cases with their derived statistics, kernel and range summaries and totals. Throws
// store::StoreError if there is no such run.
RunReport load_run_report(const store::Store& store, int64_t run);
// The run's cases with their derived statistics (against the run's copy ceiling).
std::vector<CaseResult> load_case_results(const store::Store& store, int64_t run);

// A case is identified within a run by (name, variant).
using CaseKey = std::pair<std::string, std::string>;
std::string describe(const CaseKey& key);  // "name [variant]"
// Cases by key; throws std::invalid_argument naming `which` ("run A", "baseline") on a duplicate.
std::map<CaseKey, const CaseResult*> index_cases(const std::vector<CaseResult>& cases, const std::string& which);

// Fills the derived fields of each case (median, quartiles, speedup, bandwidth) from its samples.
void derive_case_statistics(std::vector<CaseResult>& cases, double copy_ceiling_bytes_per_second);

// Quantile by linear interpolation between order statistics (q in [0, 1]); NaN for no values.
double quantile(std::vector<double> values, double q);

// A title that tells runs apart: what ran (a bench suite or case, or the traced program), on which
// GPU, at which commit, e.g. "fusekit ops suite on NVIDIA H100 80GB HBM3 at 6aab458 (run 1)".
std::string run_title(const RunInfo& run);

}  // namespace fusekit::reports
