#include "cli/commands.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>

#include "profiler/environment.h"
#include "reports/chrome_trace.h"
#include "reports/compare.h"
#include "reports/csv.h"
#include "reports/gate.h"
#include "reports/history.h"
#include "reports/html.h"
#include "reports/json.h"
#include "reports/markdown.h"
#include "reports/run_report.h"
#include "reports/terminal.h"
#include "store/store.h"
#include "suites/interrupt.h"
#include "suites/ops/ops_suite.h"
#include "suites/peers.h"
#include "suites/recorded_command.h"
#include "suites/runner.h"
#include "suites/session.h"

namespace fusekit::cli {
namespace {

using store::Store;

// The run's range names for an error line: the first few, and how many more.
std::string range_names(const std::vector<profiler::RangeStats>& ranges) {
  if (ranges.empty()) return "it has no NVTX ranges";
  constexpr size_t kShown = 8;
  std::string names = "its ranges: ";
  for (size_t i = 0; i < std::min(ranges.size(), kShown); ++i) names += (i ? ", '" : "'") + ranges[i].name + "'";
  if (ranges.size() > kShown) names += " and " + std::to_string(ranges.size() - kShown) + " more";
  return names;
}

struct OpenedRun {
  Store store;
  int64_t run;
};

OpenedRun open_run(const RunSelection& s) {
  Store store = Store::open(s.db, Store::Mode::read_only);
  int64_t run = s.run > 0 ? s.run : store.latest_run();
  (void)store.run(run);
  return {std::move(store), run};
}

// "" (the default), "none", "unranged" or "all".
std::optional<profiler::RangeProjection> parse_projection(const std::string& text) {
  if (text.empty()) return std::nullopt;
  for (auto p :
       {profiler::RangeProjection::none, profiler::RangeProjection::unranged, profiler::RangeProjection::all}) {
    if (text == profiler::projection_name(p)) return p;
  }
  throw std::invalid_argument("--project-ranges takes none, unranged or all, not '" + text + "'");
}

}  // namespace

double parse_fraction(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("empty threshold");
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a number or percentage: '" + text + "'");
  }
  std::string rest = text.substr(used);
  if (rest == "%")
    value /= 100;
  else if (!rest.empty())
    throw std::invalid_argument("not a number or percentage: '" + text + "'");
  if (!(value >= 0) || value > 10) throw std::invalid_argument("threshold out of range: '" + text + "'");
  return value;
}

void write_output(const std::string& path, const std::string& content) {
  if (path.empty() || path == "-") {
    std::cout << content;
    return;
  }
  {
    std::ifstream existing(path, std::ios::binary);
    char header[16] = {};
    if (existing && existing.read(header, 16) && std::string(header, 15) == "SQLite format 3") {
      throw std::runtime_error(path + ": is an SQLite file; refusing to overwrite it");
    }
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
  out << content;
  if (!out.flush()) throw std::runtime_error(path + ": write failed: " + std::strerror(errno));
}

std::string operator_list() {
  std::string names;
  for (const suites::OpDefinition& op : suites::ops()) names += (names.empty() ? "" : ", ") + op.name;
  return names;
}

std::string operator_shapes() {
  std::string shapes;
  for (const suites::OpDefinition& op : suites::ops()) {
    shapes += (shapes.empty() ? "" : "; ") + op.name + ": " + op.shape_syntax;
  }
  return shapes;
}

namespace {
int bench_session(suites::Session& session, const BenchOptions& o, bool ops,
                  const std::vector<suites::Case>& ops_cases);
}  // namespace

int bench(const BenchOptions& o) {
  const std::vector<std::string>& op_suites = suites::op_suites();
  const bool ops = !o.op.empty() || std::find(op_suites.begin(), op_suites.end(), o.suite) != op_suites.end();
  if (!ops && o.suite != "demo") {
    std::string names = "demo";
    for (const std::string& name : op_suites) names += ", " + name;
    throw std::invalid_argument("unknown suite '" + o.suite + "' (available: " + names + ")");
  }
  // Building the cases allocates nothing, and finds usage errors before any GPU work.
  std::vector<suites::Case> ops_cases;
  if (!o.ops.empty() && (!ops || !o.op.empty())) {
    throw std::invalid_argument("--ops selects operators of --suite ops, attention or models (for one case: --op)");
  }
  if (ops) ops_cases = suites::ops_cases({o.op, o.shape, o.dtype, o.backward, o.ops, o.op.empty() ? o.suite : "ops"});
  profiler::check_commit_override();        // before the store exists
  const suites::InterruptScope interrupts;  // SIGINT, SIGTERM: stop between cases, keep what was recorded
  suites::Session session({o.db, o.label, o.argv, o.allow_dropped});  // from here on, the run is recorded
  try {
    return bench_session(session, o, ops, ops_cases);
  } catch (const suites::Interrupted& e) {
    session.interrupt(e.exit_code());
    std::fprintf(stderr, "fusekit: %s: run %lld ends \"interrupted\"; what it recorded stays in %s\n", e.what(),
                 static_cast<long long>(session.run()), o.db.c_str());
    return e.exit_code();
  }
}

namespace {
// The recorded part of a bench run: the copy ceiling, the cases, the peers, the table.
int bench_session(suites::Session& session, const BenchOptions& o, bool ops,
                  const std::vector<suites::Case>& ops_cases) {
  session.record_copy_ceiling();
  const suites::RunnerOptions options{o.warmup, o.repetitions, o.traced_repetitions, o.warmup_ms, o.sample_us};
  if (ops) {
    if (!suites::baselines_available()) std::fprintf(stderr, "fusekit: built without libtorch: no baseline variants\n");
    session.run_cases(ops_cases, options);
    if (!o.peers.empty()) {
      session.run_peers({o.peers,
                         o.repetitions,
                         o.warmup,
                         o.warmup_ms,
                         o.sample_us,
                         {o.op, o.shape, o.dtype, o.backward, o.ops, o.op.empty() ? o.suite : "ops"}});
    }
  } else {
    session.run_demo(options);
  }
  suites::throw_if_interrupted();  // a signal after the last case too ends the run interrupted
  std::cout << reports::case_table_text(reports::load_case_results(session.store(), session.run()));
  std::cout << "run " << session.run() << " recorded in " << o.db << "\n";
  return session.finish();
}
}  // namespace

int list_cases(const CasesOptions& o) {
  if (!o.ops.empty() && !o.op.empty()) {
    throw std::invalid_argument("--ops selects operators of --suite ops, attention or models (for one case: --op)");
  }
  write_output(o.output, suites::case_listing_json(suites::list_ops_cases(
                             {o.op, o.shape, o.dtype, o.backward, o.ops, o.op.empty() ? o.suite : "ops"})));
  return 0;
}

int trace(const TraceOptions& o) {
  if (o.command.empty())
    throw std::invalid_argument("no command to trace (usage: fusekit trace --db out.db -- cmd ...)");
  const suites::InterruptScope interrupts;  // SIGINT, SIGTERM: passed on to the command, the run kept

  profiler::check_commit_override();  // before the store exists
  Store store = Store::open(o.db, Store::Mode::create);
  const profiler::Environment env = profiler::read_environment();
  const int64_t run = suites::begin_run(store, o.label, o.command, env);

  int exit_code = 0;
  try {
    exit_code = suites::run_recorded_command(o.db, run, o.command, o.flush_ms, true);
  } catch (const suites::CommandNotStarted& e) {
    // Nothing ran, so there is nothing to summarize: one line, and the shell's exit code for it.
    store.finish_run(run, "failed", 127);
    std::fprintf(stderr, "fusekit: %s\n", e.what());
    return 127;
  } catch (...) {
    store.finish_run(run, "failed", 1);  // never leave a run marked running
    throw;
  }
  const int signal = suites::interrupt_signal();
  if (signal != 0) exit_code = 128 + signal;  // whatever the command made of the signal
  store.finish_run(run, signal != 0 ? "interrupted" : exit_code == 0 ? "ok" : "failed", exit_code);
  if (signal != 0) {
    std::fprintf(stderr, "fusekit: %s, passed on to the command: run %lld ends \"interrupted\"\n",
                 suites::Interrupted(signal).what(), static_cast<long long>(run));
  }
  const reports::RunReport report = reports::load_run_report(store, run);
  std::fprintf(
      stderr,
      "fusekit: run %lld: %llu kernels, %llu copies, %llu ranges, %llu API calls recorded in %s; exit code %d\n",
      static_cast<long long>(run), static_cast<unsigned long long>(report.totals.kernels),
      static_cast<unsigned long long>(report.totals.memcpys), static_cast<unsigned long long>(report.totals.ranges),
      static_cast<unsigned long long>(report.totals.api_calls), o.db.c_str(), exit_code);
  if (report.totals.api_calls == 0 && report.totals.kernels == 0) {
    std::fprintf(stderr,
                 "fusekit: warning: nothing was traced: the program made no CUDA calls, or the injection library "
                 "did not load (FUSEKIT_TRACE_VERBOSE=1 says which)\n");
  }
  suites::check_dropped(report.run.dropped_records, o.allow_dropped);
  return exit_code;
}

namespace {

// `fusekit summary --categories`: each case's traced repetitions (or each range named --range) by
// kernel category and nested range. Launches are always projected: a variant's backward, launched
// from PyTorch's autograd thread, belongs to its case.
int summary_categories(const SummaryOptions& o, const Store& store, int64_t run, const store::RunInfo& info,
                       const profiler::Trace& trace, profiler::RangeProjection requested) {
  const profiler::RangeProjection projection =
      requested == profiler::RangeProjection::all ? requested : profiler::RangeProjection::unranged;
  const profiler::Attribution attribution = profiler::attribute(trace, projection);
  std::vector<reports::CaseBreakdown> breakdowns;
  if (!o.range.empty()) {
    profiler::RangeBreakdown b = std::move(profiler::break_down_ranges(trace, attribution, {o.range}).front());
    if (b.instances == 0) {
      throw std::runtime_error("run " + std::to_string(run) + " has no NVTX range named '" + o.range + "' (" +
                               range_names(profiler::summarize_ranges(trace, attribution)) + ")");
    }
    breakdowns.push_back({o.range, "", std::move(b)});
  } else {
    breakdowns = reports::break_down_cases(trace, attribution, reports::load_case_results(store, run));
    if (breakdowns.empty()) {
      throw std::runtime_error("run " + std::to_string(run) +
                               " has no case whose range holds GPU work: name the ranges to break down with --range");
    }
  }
  std::cout << "run " << info.id << "  " << info.started_at << "  " << info.gpu_name << "  status " << info.status
            << "  dropped records " << info.dropped_records << "\n";
  std::cout << "command: " << info.command_line << "\n\n";
  std::cout << "GPU time by kernel category, % of the case's GPU time (us per repetition):\n\n"
            << reports::category_table_text(breakdowns, projection);
  const std::string nested = reports::nested_range_tables_text(breakdowns);
  if (!nested.empty()) std::cout << "\nGPU time by nested range, % of the case's GPU time (us/rep):\n\n" << nested;
  return 0;
}

}  // namespace

int summary(const SummaryOptions& o) {
  OpenedRun r = open_run(o.source);
  const store::RunInfo info = r.store.run(r.run);
  profiler::Trace trace = r.store.load_trace(r.run);
  const profiler::RangeProjection projection =
      parse_projection(o.project_ranges).value_or(profiler::RangeProjection::none);
  if (o.categories) return summary_categories(o, r.store, r.run, info, trace, projection);
  profiler::Attribution attribution = profiler::attribute(trace, projection);
  std::optional<std::string> only;
  const auto ranges = profiler::summarize_ranges(trace, attribution);
  if (!o.range.empty()) {
    only = o.range;
    // A name that matches no range would print an empty table: say so, with the names that exist.
    if (std::none_of(ranges.begin(), ranges.end(), [&](const auto& r) { return r.name == o.range; })) {
      throw std::runtime_error("run " + std::to_string(r.run) + " has no NVTX range named '" + o.range + "' (" +
                               range_names(ranges) + ")");
    }
  }
  const auto kernels = profiler::summarize_kernels(trace, attribution, only, o.short_names);
  const auto totals = profiler::summarize_run(trace);
  std::cout << "run " << info.id << "  " << info.started_at << "  " << info.gpu_name << "  status " << info.status
            << "  dropped records " << info.dropped_records << "\n";
  std::cout << "command: " << info.command_line << "\n\n";
  std::cout << "CUDA GPU kernel summary" << (only ? " (inside ranges '" + *only + "')" : "") << ":\n\n";
  std::cout << reports::kernel_table_text(kernels, static_cast<size_t>(o.top)) << "\n";
  std::cout << "NVTX range summary:\n\n" << reports::range_table_text(ranges, static_cast<size_t>(o.top)) << "\n";
  const auto cases = reports::load_case_results(r.store, r.run);
  if (!cases.empty()) std::cout << "Cases:\n\n" << reports::case_table_text(cases) << "\n";
  std::printf(
      "totals: %llu kernels, %.3f ms kernel time, GPU busy %.3f ms of %.3f ms wall (idle %.1f%%), %llu copies (%llu "
      "bytes)\n",
      static_cast<unsigned long long>(totals.kernels), totals.kernel_ns / 1e6, totals.busy_ns / 1e6,
      totals.wall_ns / 1e6, 100 * totals.idle_fraction, static_cast<unsigned long long>(totals.memcpys),
      static_cast<unsigned long long>(totals.memcpy_bytes));
  if (attribution.kernels_without_api_record > 0) {
    std::printf("%zu kernels had no recorded launch call and are attributed to no range\n",
                attribution.kernels_without_api_record);
  }
  if (projection != profiler::RangeProjection::none) {
    std::printf("%zu kernels placed by time (%s projection) in a range that their thread did not hold open\n",
                attribution.kernels_projected, profiler::projection_name(projection));
  }
  return 0;
}

int compare(const CompareOptions& o) {
  OpenedRun a = open_run(o.a);
  const reports::RunReport report_a = reports::load_run_report(a.store, a.run);
  if (o.b.db.empty()) {
    const size_t comma = o.variants.find(',');
    if (comma == std::string::npos) throw std::invalid_argument("--variants takes two variants: A,B");
    const auto rows =
        reports::compare_variants(report_a.cases, o.variants.substr(0, comma), o.variants.substr(comma + 1));
    if (rows.empty())
      throw std::runtime_error("no case of run " + std::to_string(a.run) + " has both variants " + o.variants);
    std::cout << (o.markdown ? reports::comparison_table_markdown(rows) : reports::comparison_table_text(rows));
    return 0;
  }
  OpenedRun b = open_run(o.b);
  const reports::RunReport report_b = reports::load_run_report(b.store, b.run);
  const auto rows = reports::compare_runs(report_a.cases, report_b.cases);
  if (rows.empty() && !(report_a.cases.empty() && report_b.cases.empty())) {
    // Two runs of timed cases that share none compare nothing: a kernel diff of them would only
    // list every kernel as gone on one side and new on the other.
    throw std::runtime_error("run " + std::to_string(a.run) + " of " + o.a.db + " and run " + std::to_string(b.run) +
                             " of " + o.b.db + " have no case (name and variant) in common");
  }
  const auto diff = reports::diff_kernels(report_a.kernels, report_b.kernels);
  if (!rows.empty())
    std::cout << (o.markdown ? reports::comparison_table_markdown(rows) : reports::comparison_table_text(rows)) << "\n";
  std::cout << (o.markdown ? reports::kernel_diff_table_markdown(diff) : reports::kernel_diff_table_text(diff));
  return 0;
}

int report(const ReportOptions& o) {
  if (!o.history.empty() && o.format != "html") throw std::invalid_argument("--history is for --format html");
  OpenedRun r = open_run(o.source);
  const reports::RunReport rep = reports::load_run_report(r.store, r.run, {parse_projection(o.project_ranges)});
  std::string content;
  if (o.format == "csv") {
    if (o.table == "cases")
      content = reports::cases_csv(rep);
    else if (o.table == "cases-wide")
      content = reports::cases_wide_csv(rep);
    else if (o.table == "kernels")
      content = reports::kernels_csv(rep);
    else if (o.table == "ranges")
      content = reports::ranges_csv(rep);
    else if (o.table == "categories")
      content = reports::categories_csv(rep);
    else if (o.table == "step-ranges")
      content = reports::step_ranges_csv(rep);
    else
      throw std::invalid_argument("unknown table '" + o.table +
                                  "' (cases, cases-wide, kernels, ranges, categories, step-ranges)");
  } else if (o.format == "html") {
    // The history: the runs of the report's store and of the --history stores that share its cases.
    std::vector<Store> others;
    for (const std::string& path : o.history) others.push_back(Store::open(path, Store::Mode::read_only));
    std::vector<const Store*> stores = {&r.store};
    for (const Store& s : others) stores.push_back(&s);
    content = reports::report_html(rep, reports::load_history(stores, rep.run, rep.cases));
  } else if (o.format == "md") {
    content = reports::report_markdown(rep);
  } else if (o.format == "json") {
    content = reports::report_json(rep);
  } else {
    throw std::invalid_argument("unknown format '" + o.format + "' (csv, html, md, json)");
  }
  write_output(o.output, content);
  return 0;
}

int export_trace(const ExportOptions& o) {
  OpenedRun r = open_run(o.source);
  write_output(o.output, reports::chrome_trace_json(r.store.load_trace(r.run), r.store.run(r.run)));
  return 0;
}

int index(const IndexOptions& o) {
  std::vector<reports::IndexEntry> entries;
  for (const std::string& entry : o.entries) {
    const size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == entry.size()) {
      throw std::invalid_argument("'" + entry + "' is not REPORT=STORE[#RUN] (e.g. ops.html=ops.db)");
    }
    // STORE#RUN: that run of the store (a store may hold several); STORE alone: its latest run.
    std::string db = entry.substr(equals + 1);
    int64_t run = 0;
    const size_t hash = db.rfind('#');
    if (hash != std::string::npos && hash + 1 < db.size() &&
        db.find_first_not_of("0123456789", hash + 1) == std::string::npos) {
      if (db.size() - hash - 1 > 18) throw std::invalid_argument("'" + entry + "': no run has so large an id");
      run = std::stoll(db.substr(hash + 1));
      db.resize(hash);
      if (run <= 0) throw std::invalid_argument("'" + entry + "': run ids start at 1");
    }
    OpenedRun r = open_run({db, run});
    reports::IndexEntry e;
    e.href = entry.substr(0, equals);
    e.run = r.store.run(r.run);
    const std::vector<store::StoredCase> cases = r.store.load_cases(r.run);
    std::set<std::string> names, variants;
    for (const store::StoredCase& c : cases) {
      names.insert(c.info.name);
      variants.insert(c.info.variant);
    }
    e.cases = names.size();
    e.variants = variants.size();
    entries.push_back(std::move(e));
  }
  write_output(o.output, reports::index_html(entries));
  return 0;
}

int gate(const GateOptions& o) {
  reports::GateOptions options;
  options.threshold = parse_fraction(o.threshold);
  if (!(o.alpha > 0 && o.alpha < 1)) throw std::invalid_argument("--alpha must be between 0 and 1");
  options.alpha = o.alpha;
  options.min_samples = static_cast<size_t>(o.min_samples);
  options.gate_every_variant = o.every_variant;
  const int ways = (o.baseline.run > 0) + (o.baseline_runs > 0) + !o.baseline_commit.empty();
  if (ways > 1) {
    throw std::invalid_argument(
        "--baseline-run, --baseline-runs and --baseline-commit each choose the baseline: give one");
  }
  // Emptied first, so that a gate that fails before it has gated leaves no operators from an
  // earlier run behind (scripts/ci-gate.sh reads "exit 1 and operators listed" as a regression).
  if (!o.regressed_ops_output.empty() && o.regressed_ops_output != "-") write_output(o.regressed_ops_output, "");
  OpenedRun candidate = open_run(o.candidate);
  OpenedRun baseline = open_run(o.baseline);
  std::vector<reports::CaseResult> baseline_cases;
  std::string baseline_text;
  if (o.baseline_runs > 0 || !o.baseline_commit.empty()) {
    const std::vector<store::RunInfo> runs = baseline.store.runs();
    std::vector<int64_t> ids;
    if (!o.baseline_commit.empty()) {
      const int64_t id = reports::run_of_commit(runs, o.baseline_commit);
      if (id == 0) throw std::runtime_error("no finished run at commit " + o.baseline_commit + " in " + o.baseline.db);
      ids = {id};
      baseline_text = "baseline: run " + std::to_string(id) + " of " + o.baseline.db + " (commit " +
                      baseline.store.run(id).git_commit + ")\n";
    } else {
      const std::string gpu = candidate.store.run(candidate.run).gpu_name;
      const bool same_store = o.baseline.db == o.candidate.db;
      ids = reports::history_runs(runs, gpu, static_cast<size_t>(o.baseline_runs), same_store ? candidate.run : 0);
      if (ids.empty()) {
        throw std::runtime_error("no finished run on the candidate's GPU ('" + gpu + "') in " + o.baseline.db +
                                 (same_store ? " other than the candidate" : ""));
      }
      baseline_text = "baseline: " + std::to_string(ids.size()) + " run(s) of " + o.baseline.db + " on '" + gpu +
                      "', samples pooled (runs";
      for (int64_t id : ids) baseline_text += " " + std::to_string(id);
      baseline_text += ")\n";
    }
    std::vector<std::vector<reports::CaseResult>> per_run;
    for (int64_t id : ids) per_run.push_back(reports::load_case_results(baseline.store, id));
    baseline_cases = reports::pool_case_results(per_run);
    baseline.run = ids.back();  // the kernels of the newest of them
  } else {
    baseline_cases = reports::load_case_results(baseline.store, baseline.run);
  }
  const std::vector<reports::CaseResult> candidate_cases = reports::load_case_results(candidate.store, candidate.run);
  auto result = reports::run_gate(baseline_cases, candidate_cases, options);
  // The kernels of each case's repetitions: on request, and for the Markdown's regressed cases.
  if (o.kernels || o.ranges || (result.any_regression() && !o.markdown_output.empty())) {
    std::set<reports::CaseKey> keys;
    for (const reports::GateRow& row : result.rows) keys.emplace(row.name, row.variant);
    struct Traced {
      profiler::Trace trace;
      profiler::Attribution attribution;
    };
    const auto traced = [&](const OpenedRun& r) {
      Traced t{r.store.load_trace(r.run), {}};
      const auto projection = reports::is_training_step_run(r.store.run(r.run)) ? profiler::RangeProjection::unranged
                                                                                : profiler::RangeProjection::none;
      t.attribution = profiler::attribute(t.trace, projection);
      return t;
    };
    const Traced base = traced(baseline), cand = traced(candidate);
    result.kernels =
        reports::gate_kernels(result, reports::case_repetition_kernels(base.trace, base.attribution, keys),
                              reports::case_repetition_kernels(cand.trace, cand.attribution, keys), options);
    result.kernel_rows_requested = o.kernels;
    if (o.ranges) {
      result.ranges = reports::gate_kernels(
          result, reports::case_repetition_ranges(base.trace, base.attribution, keys, o.range_depth),
          reports::case_repetition_ranges(cand.trace, cand.attribution, keys, o.range_depth), options);
    }
  }
  std::cout << baseline_text << reports::gate_table_text(result);
  if (!o.markdown_output.empty())
    write_output(o.markdown_output,
                 (baseline_text.empty() ? "" : baseline_text + "\n") + reports::gate_table_markdown(result));
  if (!o.regressed_ops_output.empty()) {
    // What a confirming re-run measures again (scripts/ci-gate.sh): `fusekit bench --ops` of these.
    std::map<reports::CaseKey, std::string> op_of;
    for (const reports::CaseResult& c : candidate_cases) op_of[{c.info.name, c.info.variant}] = c.info.op;
    std::set<std::string> ops;
    for (const reports::GateRow& row : result.rows) {
      const auto it = op_of.find({row.name, row.variant});
      if (row.fails() && it != op_of.end() && !it->second.empty()) ops.insert(it->second);
    }
    std::string text;
    for (const std::string& op : ops) text += op + "\n";
    write_output(o.regressed_ops_output, text);
  }
  if (result.rows.empty()) throw std::runtime_error("no case is present in both runs; nothing to gate");
  const auto gated =
      std::count_if(result.rows.begin(), result.rows.end(), [](const reports::GateRow& row) { return row.gated; });
  if (gated == 0) {
    throw std::runtime_error(
        "no fused variant is present in both runs; nothing to gate (--every-variant gates "
        "the libtorch baseline, peers and references too)");
  }
  if (result.any_regression()) return 1;
  // A case with too few samples was not tested: without --allow-too-few-samples that is no pass.
  const auto untested = std::count_if(result.rows.begin(), result.rows.end(), [](const reports::GateRow& row) {
    return row.gated && row.verdict == reports::Verdict::too_few_samples;
  });
  if (untested > 0 && !o.allow_too_few_samples) {
    throw std::runtime_error(std::to_string(untested) + " of " + std::to_string(gated) + " gated" +
                             " cases have fewer than " + std::to_string(options.min_samples) +
                             " samples on a side and were not tested: not a pass (--allow-too-few-samples accepts it)");
  }
  return 0;
}

}  // namespace fusekit::cli
