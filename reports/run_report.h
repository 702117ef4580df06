// What the store knows about one run, in the shape the writers need.
//
// The store holds raw records; a RunReport is computed from them on read (case statistics here,
// attribution and summaries from profiler/), so every writer shows the same numbers and none of
// them queries SQL.
//
// Two attributions feed it. The range table keeps the launching thread's ranges (profiler's
// RangeProjection::none) except for runs of whole training steps, whose backward PyTorch launches
// from its autograd thread: there launches from threads without an open range are projected by
// time (RangeProjection::unranged). The case breakdowns (GPU time of each case's traced
// repetitions by kernel category and nested range) are always projected, so that a variant's
// backward counts inside its case.
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
  std::vector<store::CaseMetric> metrics;  // measured once per case (store/run_records.h)
};

// The case's metric of this name ("peak_memory_bytes"), if it has one.
std::optional<double> case_metric(const CaseResult& c, const std::string& name);

// A training step's batch (sequences for BERT, images for Swin): the ":b<N>" field of the shape of
// a case whose operator ends in "_step" (suites/ops/bert_step.cpp, swin_step.cpp); none otherwise
// (a shape that leaves the batch to its preset included).
std::optional<int64_t> step_batch(const store::CaseInfo& info);
// Items (sequences or images) trained per second by the median step: batch x 1e9 / median_ns.
std::optional<double> items_per_second(const CaseResult& c);
// The case's "peak_memory_bytes" in MiB, if it has one (the models suite's steps).
std::optional<double> peak_memory_mib(const CaseResult& c);

// What a case's traced repetitions ran: the instances of its range "<name> [<variant>]".
struct CaseBreakdown {
  std::string name;
  std::string variant;
  profiler::RangeBreakdown breakdown;  // breakdown.repetitions: the runner's "rep" ranges in it (0: not known)
};

struct RunReport {
  RunInfo run;
  std::vector<CaseResult> cases;
  std::vector<profiler::KernelStats> kernels;
  std::vector<profiler::RangeStats> ranges;
  profiler::RunTotals totals;
  profiler::RangeProjection range_projection = profiler::RangeProjection::none;  // of `ranges`
  std::vector<CaseBreakdown> case_breakdowns;  // cases whose range holds GPU work, a case's variants together
  profiler::RangeProjection breakdown_projection = profiler::RangeProjection::unranged;
  // Per (case name, variant): the kernels of the case's traced repetitions (reports/case_kernels.h).
  std::map<std::pair<std::string, std::string>, VariantKernels> case_kernels;
};

struct ReportOptions {
  // The range table's attribution; unset: unranged for a training-step run, none for others. The
  // case breakdowns take `all` from here, and unranged otherwise.
  std::optional<profiler::RangeProjection> projection;
};

// The run's cases with their derived statistics, kernel and range summaries, totals and case
// breakdowns. Throws store::StoreError if there is no such run.
RunReport load_run_report(const store::Store& store, int64_t run, const ReportOptions& options = {});

// What each case's range "<name> [<variant>]" holds, by kernel category and nested range; cases
// whose range holds no GPU work are left out, the variants of a case follow each other.
std::vector<CaseBreakdown> break_down_cases(const profiler::Trace& trace, const profiler::Attribution& attribution,
                                            const std::vector<CaseResult>& cases);

// A run of whole training steps: its recorded command line runs the models suite (`--suite models`).
bool is_training_step_run(const RunInfo& run);
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
