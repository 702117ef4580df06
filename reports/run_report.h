// What the store knows about one run, in the shape the writers need.
//
// The store holds raw records; a RunReport is computed from them on read (attribution and
// summaries from profiler/), so every writer shows the same numbers and none of them queries SQL.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "profiler/records.h"
#include "profiler/summary.h"

namespace fusekit::reports {

struct RunInfo {
  int64_t id = 0;
  std::string started_at;  // ISO 8601, UTC
  std::string finished_at;
  std::string label;
  std::string command_line;
  std::string git_commit;
  std::string host;
  std::string gpu_name;
  std::string gpu_uuid;
  std::string driver_version;
  std::string cuda_version;
  std::string libtorch_version;
  std::string status;  // running | ok | failed
  int exit_code = 0;
  uint64_t dropped_records = 0;
  double copy_ceiling_bytes_per_second = 0;  // measured device copy bandwidth; 0 if unknown
};

// A benchmark case: `name` identifies what is computed (e.g. "layernorm/8192x768/fp16/fwd");
// `variant` says how (baseline | fused | peer:eager | peer:compile). Variants of one name compute
// the same thing, so their medians give speedups.
struct CaseInfo {
  std::string name;
  std::string op;
  std::string shape;
  std::string dtype;
  std::string variant;
  double bytes = 0;  // bytes that must move: each input read once, each output written once
  double flops = 0;
};

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
};

// A case is identified within a run by (name, variant).
using CaseKey = std::pair<std::string, std::string>;
std::string describe(const CaseKey& key);  // "name [variant]"
// Cases by key; throws std::invalid_argument naming `which` ("run A", "baseline") on a duplicate.
std::map<CaseKey, const CaseResult*> index_cases(const std::vector<CaseResult>& cases, const std::string& which);

// Fills the derived fields of each case (median, quartiles, speedup, bandwidth) from its samples.
void derive_case_statistics(std::vector<CaseResult>& cases, double copy_ceiling_bytes_per_second);

// Quantile by linear interpolation between order statistics (q in [0, 1]); NaN for no values.
double quantile(std::vector<double> values, double q);

}  // namespace fusekit::reports
