// The regression gate: does a candidate run time any case slower than a baseline run?
//
// A case regresses only when two things hold at once: the Mann-Whitney U test says the two sample sets
// differ (p < alpha) and the median slowed down by more than a threshold. The test alone flags tiny but
// consistent shifts on quiet machines; the threshold alone flags noise. Medians come from the samples,
// not from the stored median_ns.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "reports/case_kernels.h"
#include "reports/run_report.h"
#include "store/run_records.h"

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
  // Which variants can fail the gate. By default fusekit's own ("fused" and "fused:*"): the libtorch
  // baseline, the peers and the reference variants time code a change to fusekit does not touch
  // (libtorch's embedding backward, say, moves by 20% between two runs of one hour), so their verdicts
  // are shown as references, beside the gated ones, and fail nothing. True: every variant is gated.
  bool gate_every_variant = false;
};

// Whether a variant is fusekit's own: "fused" or "fused:<anything>".
bool is_fusekit_variant(const std::string& variant);

enum class Verdict { regressed, improved, unchanged, too_few_samples };

struct GateRow {
  std::string name;
  std::string variant;
  size_t baseline_n = 0, candidate_n = 0;
  double baseline_median_ns = 0, candidate_median_ns = 0;
  double change = 0;   // candidate / baseline - 1
  double p_value = 1;  // NaN for too_few_samples
  Verdict verdict = Verdict::unchanged;
  bool gated = true;  // false: a reference variant (GateOptions::gate_every_variant), its verdict fails nothing
  bool fails() const { return gated && verdict == Verdict::regressed; }
};

// One kernel of a case, tested on its per-repetition times (reports/case_kernels.h): one sample per traced
// repetition. A kernel that ran in only one of the runs takes 0 ns per repetition in the other.
struct KernelGateRow {
  std::string kernel;
  size_t baseline_n = 0, candidate_n = 0;  // repetitions
  double baseline_median_ns = 0, candidate_median_ns = 0;
  double baseline_mean_ns = 0, candidate_mean_ns = 0;  // time per repetition: the total over the repetitions
  double change = 0;   // of the medians: candidate / baseline - 1; +inf for a kernel new in the candidate
  double p_value = 1;  // NaN for too_few_samples
  Verdict verdict = Verdict::unchanged;
  double moved_ns() const { return candidate_mean_ns - baseline_mean_ns; }
};

// The kernels of one case and variant present in both runs.
struct CaseKernelGate {
  std::string name;
  std::string variant;
  size_t baseline_repetitions = 0, candidate_repetitions = 0;  // 0: the run marks no "rep" ranges in the case
  std::vector<KernelGateRow> rows;  // by |moved_ns| largest first (then by name); empty without repetitions
};

struct GateResult {
  std::vector<GateRow> rows;  // in the order of the baseline
  // The GPU conditions the two runs were timed under (the cases' "gpu.*" metrics, recorded by the
  // runner: profiler/gpu_conditions.h): one line per difference that can move timings (clocks,
  // temperature, other processes on the GPU), and one per case timed while its GPU throttled.
  std::vector<std::string> condition_warnings;
  std::vector<std::string> throttled_cases;   // "<name> [<variant>]: candidate (sw power cap)"
  std::vector<std::string> only_in_baseline;  // "name [variant]", of the operators the candidate timed
  std::vector<std::string> only_in_candidate;
  // The baseline's cases of operators the candidate did not time at all (a run of some operators,
  // `bench --ops`): counted per operator rather than listed one by one.
  std::map<std::string, size_t> unmeasured_operators;  // operator -> cases
  // Likewise the cases of the timed operators in variants the candidate ran in no case (the peers,
  // which a gate run without --peers does not time); a fused variant that vanished stays listed.
  std::map<std::string, size_t> unmeasured_variants;  // variant -> cases
  // Per row (same order) when the kernels were gated (gate_kernels); empty otherwise.
  std::vector<CaseKernelGate> kernels;
  bool kernel_rows_requested = false;  // the writers show every kernel row, not only the regressed cases' top 3
  // Per row when the NVTX ranges were gated (gate_kernels over case_repetition_ranges): the same
  // test on each range's GPU time per traced repetition ("kernel" holds the range's path).
  std::vector<CaseKernelGate> ranges;
  bool any_regression() const;  // of a gated row
};

// ---- Baselines beyond one run
// A baseline pooled from several runs of a history store: per (name, variant) the samples of every
// run that timed it, oldest run first, with the newest run's case info and statistics recomputed
// from the pooled samples. Against the recent history of a GPU rather than one run, the run-to-run
// spread (clocks, temperature, the machine a CI job landed on) becomes part of the baseline's
// spread, so that one quick or slow baseline run does not decide the gate.
std::vector<CaseResult> pool_case_results(const std::vector<std::vector<CaseResult>>& runs);

// The runs a history baseline takes: the `count` newest runs of `runs` that finished ("ok") on
// a GPU named `gpu_name`, other than `exclude` (the candidate, where it lives in the same store);
// oldest first. Fewer where fewer exist.
std::vector<int64_t> history_runs(const std::vector<store::RunInfo>& runs, const std::string& gpu_name, size_t count,
                                  int64_t exclude);

// The newest finished run whose commit starts with `commit` (at least 7 hexadecimal digits), or
// 0 where none does; std::invalid_argument for a commit that is not such a prefix.
int64_t run_of_commit(const std::vector<store::RunInfo>& runs, const std::string& commit);

// The conditions check of run_gate, on its own: fills result.condition_warnings and
// result.throttled_cases from the matched cases' metrics. Thresholds: median SM clock apart by
// more than 5%, memory clock by more than 2%, median temperature by more than 15 C, any other
// process on the GPU; throttling as profiler::clocks_event::throttling.
void check_gpu_conditions(GateResult& result, const std::vector<CaseResult>& baseline,
                          const std::vector<CaseResult>& candidate);

// Matches cases by (info.name, info.variant).
GateResult run_gate(const std::vector<CaseResult>& baseline, const std::vector<CaseResult>& candidate,
                    const GateOptions& options);

// Per case and variant of `result.rows`: each kernel that ran in its traced repetitions in either run, tested
// with the same U test and threshold rule as the cases (options.min_samples repetitions per side at least,
// else too_few_samples). Kernel verdicts are diagnostics: any_regression() reads the case rows only.
std::vector<CaseKernelGate> gate_kernels(const GateResult& result, const std::map<CaseKey, RepetitionKernels>& baseline,
                                         const std::map<CaseKey, RepetitionKernels>& candidate,
                                         const GateOptions& options);

// The same rule on two sample sets: verdict, p-value and change of the medians.
struct SampleTest {
  double change = 0;
  double p_value = 1;
  Verdict verdict = Verdict::unchanged;
};
SampleTest test_samples(const std::vector<double>& baseline, const std::vector<double>& candidate,
                        const GateOptions& options);

std::string verdict_name(Verdict verdict);

// The gate's tables are written by the writers: gate_table_text (reports/terminal.h) and
// gate_table_markdown (reports/markdown.h).

}  // namespace fusekit::reports
