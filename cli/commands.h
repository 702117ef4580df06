// The subcommands of `fusekit`. Each takes its parsed options and returns the process exit code;
// failures throw, and fusekit.cpp turns them into one line on stderr and exit code 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusekit::cli {

struct BenchOptions {
  std::string db;
  std::string suite = "demo";
  std::string label;
  int warmup = 10;
  double warmup_ms = 25;
  double sample_us = 500;  // suites::RunnerOptions::sample_us
  int repetitions = 50;
  int traced_repetitions = 5;
  bool allow_dropped = false;
  std::string op;  // a single operator case: with shape and dtype
  std::string shape;
  std::string dtype;
  bool backward = false;
  std::vector<std::string> ops;  // with --suite ops: only these operators
  std::string peers;             // a peers script (scripts/peers/ops.py) to run traced into the same run
  std::vector<std::string> argv;
};
int bench(const BenchOptions& o);

// For bench's help: the operators of the ops suite ("layernorm, ...") and their shape syntaxes
// ("layernorm: ROWSxCOLUMNS; ...").
std::string operator_list();
std::string operator_shapes();

// `fusekit cases`: the cases bench would run for the same selection, as the peers' JSON listing
// (suites/peers.h). Needs no GPU.
struct CasesOptions {
  std::string suite = "ops";
  std::string op;
  std::string shape;
  std::string dtype;
  bool backward = false;
  std::vector<std::string> ops;
  std::string output;  // "" or "-": stdout
};
int list_cases(const CasesOptions& o);

struct TraceOptions {
  std::string db;
  std::string label;
  int flush_ms = 1000;
  bool allow_dropped = false;
  std::vector<std::string> command;
};
int trace(const TraceOptions& o);

struct RunSelection {
  std::string db;
  int64_t run = 0;  // 0: the latest run
};

struct SummaryOptions {
  RunSelection source;
  std::string range;  // only kernels inside ranges of this name
  bool short_names = false;
  int top = 30;
  std::string project_ranges;  // "": the launching thread's ranges; "unranged" | "all" (profiler::RangeProjection)
  bool categories = false;     // GPU time by kernel category and nested range, per case (or per --range)
};
int summary(const SummaryOptions& o);

struct CompareOptions {
  RunSelection a;
  RunSelection b;        // db empty: compare variants within a
  std::string variants;  // "baseline,fused"
  bool markdown = false;
};
int compare(const CompareOptions& o);

struct ReportOptions {
  RunSelection source;
  std::string format;                // csv | html | md | json
  std::string table = "cases";       // for csv: cases | cases-wide | kernels | ranges | categories | step-ranges
  std::string output;                // "" or "-": stdout
  std::string project_ranges;        // "": by the run (reports::ReportOptions); "none" | "unranged" | "all"
  std::vector<std::string> history;  // for html: more stores whose runs the history charts show
};
int report(const ReportOptions& o);

struct ExportOptions {
  RunSelection source;
  std::string output;
};
int export_trace(const ExportOptions& o);

struct IndexOptions {
  std::vector<std::string> entries;  // REPORT=STORE: a report's address and the store whose latest run it shows
  std::string output;
};
int index(const IndexOptions& o);

struct GateOptions {
  RunSelection baseline;
  int baseline_runs = 0;        // > 0: pool the newest N runs of the baseline store on the candidate's GPU
  std::string baseline_commit;  // the newest run of the baseline store at this commit
  RunSelection candidate;
  std::string threshold = "5%";
  double alpha = 0.01;
  int min_samples = 5;
  std::string markdown_output;
  std::string regressed_ops_output;    // the operators of the regressed cases, one per line (a re-run's --ops)
  bool allow_too_few_samples = false;  // a case with too few samples to test does not fail the gate
  bool every_variant = false;          // gate the libtorch baseline, peers and references too
  bool kernels = false;                // also test each case's kernels per traced repetition
  bool ranges = false;                 // also test each case's NVTX ranges per traced repetition
  int range_depth = 2;                 // how many range names below "rep" tell ranges apart
};
int gate(const GateOptions& o);

// "5%" -> 0.05, "0.05" -> 0.05; throws std::invalid_argument on anything else.
double parse_fraction(const std::string& text);

// Writes `content` to `path` ("" or "-" is stdout); refuses to overwrite an SQLite file.
void write_output(const std::string& path, const std::string& content);

}  // namespace fusekit::cli
