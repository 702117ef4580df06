#include "cli/commands.h"

#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "profiler/cupti_tracer.h"
#include "profiler/environment.h"
#include "reports/chrome_trace.h"
#include "reports/compare.h"
#include "reports/csv.h"
#include "reports/gate.h"
#include "reports/html.h"
#include "reports/json.h"
#include "reports/markdown.h"
#include "reports/run_report.h"
#include "reports/terminal.h"
#include "store/store.h"
#include "suites/demo.h"
#include "suites/ops/ops_suite.h"
#include "suites/runner.h"

namespace fusekit::cli {
namespace {

using store::Store;

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " ") + p;
  return out;
}

store::RunInfo describe_run(const std::string& label, const std::vector<std::string>& argv,
                            const profiler::Environment& env) {
  store::RunInfo info;
  info.label = label;
  // The program by its name, not the machine's path to it.
  std::vector<std::string> words = argv;
  if (!words.empty()) words[0] = words[0].substr(words[0].find_last_of('/') + 1);
  info.command_line = join(words);
  info.git_commit = env.git_commit;
  info.host = env.host;
  if (!env.gpus.empty()) {
    info.gpu_name = env.gpus.front().name;
    info.gpu_uuid = env.gpus.front().uuid;
  }
  info.driver_version = env.driver_version;
  info.cuda_version = env.runtime_version;
  info.libtorch_version = env.libtorch_version;
  return info;
}

std::string directory_of_executable() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.find_last_of('/'));
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

void check_dropped(uint64_t dropped, bool allowed) {
  if (dropped == 0) return;
  if (!allowed) {
    throw std::runtime_error(std::to_string(dropped) +
                             " trace records were dropped (the data kept is in the store); rerun, or pass "
                             "--allow-dropped to accept an incomplete trace");
  }
  std::fprintf(stderr, "fusekit: warning: %llu trace records were dropped\n", static_cast<unsigned long long>(dropped));
}

// Runs `command` with FUSEKIT_TRACE_DB and FUSEKIT_TRACE_RUN naming `run` of the store at `db`, and,
// if `traced`, with the injection library, its records going into that run. Returns its exit code
// (128 + signal if killed, 127 if it could not be started).
int run_child(const std::string& db, int64_t run, const std::vector<std::string>& command, int flush_ms, bool traced) {
  const char* override_path = std::getenv("FUSEKIT_INJECT_LIBRARY");
  const std::string inject = override_path ? override_path : directory_of_executable() + "/libfusekit_inject.so";
  const std::string cupti = profiler::cupti_library_path();
  if (traced && access(inject.c_str(), R_OK) != 0) throw std::runtime_error("injection library not found: " + inject);
  if (traced && cupti.empty()) throw std::runtime_error("the CUPTI library is not loaded; cannot trace NVTX ranges");
  // Everything the child needs is built here, before it exists: between fork and exec only
  // async-signal-safe calls are allowed, so the child is started with posix_spawnp.
  std::vector<std::string> overrides = {"FUSEKIT_TRACE_DB=" + db, "FUSEKIT_TRACE_RUN=" + std::to_string(run),
                                        "FUSEKIT_TRACE_FLUSH_MS=" + std::to_string(flush_ms)};
  if (traced) {
    overrides.push_back("CUDA_INJECTION64_PATH=" + inject);
    overrides.push_back("NVTX_INJECTION64_PATH=" + cupti);
  }
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& o : overrides) replaced = replaced || o.compare(0, key.size(), key) == 0;
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), overrides.begin(), overrides.end());
  std::vector<char*> envp, argv;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  const int rc = posix_spawnp(&child, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) {
    std::fprintf(stderr, "fusekit: cannot run '%s': %s\n", argv[0], std::strerror(rc));
    return 127;
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
    throw std::invalid_argument("--ops selects operators of --suite ops or attention (for one case: --op)");
  }
  if (ops) ops_cases = suites::ops_cases({o.op, o.shape, o.dtype, o.backward, o.ops, o.op.empty() ? o.suite : "ops"});
  if (access(o.db.c_str(), F_OK) == 0) (void)Store::open(o.db, Store::Mode::read_only);  // refuse a foreign file first
  if (std::string reason = profiler::gpu_unavailable_reason(); !reason.empty()) {
    throw std::runtime_error("no GPU: " + reason);
  }
  profiler::prepare_nvtx_injection();  // before the first NVTX call
  Store store = Store::open(o.db, Store::Mode::create);
  const profiler::Environment env = profiler::read_environment();
  const int64_t run = store.begin_run(describe_run(o.label, o.argv, env));
  for (const auto& g : env.gpus) store.add_gpu(run, g);
  try {
    const double ceiling = suites::measure_copy_ceiling(size_t{1} << 30, 20);
    store.set_copy_ceiling(run, ceiling);
    std::fprintf(stderr, "fusekit: device copy ceiling %.2f TB/s\n", ceiling / 1e12);
    suites::RunnerOptions options{o.warmup, o.repetitions, o.traced_repetitions, o.warmup_ms, o.sample_us};
    if (ops) {
      if (!suites::baselines_available())
        std::fprintf(stderr, "fusekit: built without libtorch: no baseline variants\n");
      suites::run_cases(store, run, ops_cases, options);
      if (!o.peers.empty()) {
        // PyTorch eager and torch.compile on the same cases: timed untraced, then traced for the
        // kernel shares, both into this run.
        std::fprintf(stderr, "fusekit: timing the peers: python3 %s\n", o.peers.c_str());
        std::vector<std::string> peer_args = {"python3",     o.peers,
                                              "--reps",      std::to_string(o.repetitions),
                                              "--warmup",    std::to_string(o.warmup),
                                              "--warmup-ms", std::to_string(o.warmup_ms),
                                              "--sample-us", std::to_string(o.sample_us)};
        if (!o.op.empty()) {  // the one case bench ran
          peer_args.insert(peer_args.end(), {"--ops", o.op, "--shapes", o.shape, "--dtypes", o.dtype, "--directions",
                                             o.backward ? "fwd+bwd" : "fwd"});
        } else {
          if (!o.dtype.empty()) peer_args.insert(peer_args.end(), {"--dtypes", o.dtype});  // one dtype
          // The operators bench ran: those named, else every one of the suite.
          std::string names;
          for (const suites::OpDefinition& op : suites::ops()) {
            const bool named = std::find(o.ops.begin(), o.ops.end(), op.name) != o.ops.end();
            if (op.suite == o.suite && (o.ops.empty() || named)) names += (names.empty() ? "" : ",") + op.name;
          }
          peer_args.insert(peer_args.end(), {"--ops", names});
        }
        int code = run_child(o.db, run, peer_args, 1000, false);
        if (code == 0) {
          std::fprintf(stderr, "fusekit: tracing the peers: python3 %s --traced-only\n", o.peers.c_str());
          peer_args.push_back("--traced-only");
          code = run_child(o.db, run, peer_args, 1000, true);
        }
        if (code != 0) throw std::runtime_error("the peers script failed with exit code " + std::to_string(code));
      }
    } else {
      suites::DemoSuite demo;
      profiler::CuptiTracer& tracer = profiler::CuptiTracer::instance();
      tracer.start();
      demo.upload(nullptr);
      tracer.stop();
      store.append_trace(run, tracer.flush());
      suites::run_cases(store, run, demo.cases(), options);
    }
    store.finish_run(run, "ok", 0);
    std::cout << reports::case_table_text(reports::load_case_results(store, run));
    std::cout << "run " << run << " recorded in " << o.db << "\n";
    check_dropped(store.run(run).dropped_records, o.allow_dropped);
  } catch (...) {
    store.finish_run(run, "failed", 1);
    throw;
  }
  return 0;
}

int trace(const TraceOptions& o) {
  if (o.command.empty())
    throw std::invalid_argument("no command to trace (usage: fusekit trace --db out.db -- cmd ...)");

  Store store = Store::open(o.db, Store::Mode::create);
  const profiler::Environment env = profiler::read_environment();
  const int64_t run = store.begin_run(describe_run(o.label, o.command, env));
  for (const auto& g : env.gpus) store.add_gpu(run, g);

  int exit_code = 0;
  try {
    exit_code = run_child(o.db, run, o.command, o.flush_ms, true);
  } catch (...) {
    store.finish_run(run, "failed", 1);  // never leave a run marked running
    throw;
  }
  store.finish_run(run, exit_code == 0 ? "ok" : "failed", exit_code);
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
  check_dropped(report.run.dropped_records, o.allow_dropped);
  return exit_code;
}

int summary(const SummaryOptions& o) {
  OpenedRun r = open_run(o.source);
  const store::RunInfo info = r.store.run(r.run);
  profiler::Trace trace = r.store.load_trace(r.run);
  profiler::Attribution attribution = profiler::attribute(trace);
  std::optional<std::string> only;
  if (!o.range.empty()) only = o.range;
  const auto kernels = profiler::summarize_kernels(trace, attribution, only, o.short_names);
  const auto totals = profiler::summarize_run(trace);
  std::cout << "run " << info.id << "  " << info.started_at << "  " << info.gpu_name << "  status " << info.status
            << "  dropped records " << info.dropped_records << "\n";
  std::cout << "command: " << info.command_line << "\n\n";
  std::cout << "CUDA GPU kernel summary" << (only ? " (inside ranges '" + *only + "')" : "") << ":\n\n";
  std::cout << reports::kernel_table_text(kernels, static_cast<size_t>(o.top)) << "\n";
  std::cout << "NVTX range summary:\n\n"
            << reports::range_table_text(profiler::summarize_ranges(trace, attribution), static_cast<size_t>(o.top))
            << "\n";
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
  const auto diff = reports::diff_kernels(report_a.kernels, report_b.kernels);
  if (!rows.empty())
    std::cout << (o.markdown ? reports::comparison_table_markdown(rows) : reports::comparison_table_text(rows)) << "\n";
  std::cout << (o.markdown ? reports::kernel_diff_table_markdown(diff) : reports::kernel_diff_table_text(diff));
  return 0;
}

int report(const ReportOptions& o) {
  OpenedRun r = open_run(o.source);
  const reports::RunReport rep = reports::load_run_report(r.store, r.run);
  std::string content;
  if (o.format == "csv") {
    if (o.table == "cases")
      content = reports::cases_csv(rep);
    else if (o.table == "kernels")
      content = reports::kernels_csv(rep);
    else if (o.table == "ranges")
      content = reports::ranges_csv(rep);
    else
      throw std::invalid_argument("unknown table '" + o.table + "' (cases, kernels, ranges)");
  } else if (o.format == "html") {
    content = reports::report_html(rep);
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

int gate(const GateOptions& o) {
  reports::GateOptions options;
  options.threshold = parse_fraction(o.threshold);
  if (!(o.alpha > 0 && o.alpha < 1)) throw std::invalid_argument("--alpha must be between 0 and 1");
  options.alpha = o.alpha;
  options.min_samples = static_cast<size_t>(o.min_samples);
  OpenedRun baseline = open_run(o.baseline);
  OpenedRun candidate = open_run(o.candidate);
  const auto result = reports::run_gate(reports::load_case_results(baseline.store, baseline.run),
                                        reports::load_case_results(candidate.store, candidate.run), options);
  std::cout << reports::gate_table_text(result);
  if (!o.markdown_output.empty()) write_output(o.markdown_output, reports::gate_table_markdown(result));
  if (result.rows.empty()) throw std::runtime_error("no case is present in both runs; nothing to gate");
  return result.any_regression() ? 1 : 0;
}

}  // namespace fusekit::cli
