// fusekit: the command line. Parsing and wiring only; the work is in commands.cpp's callees.
// Exit codes: 0 success, 1 failure (or a regression found by `gate`), 2 usage error.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "cli/commands.h"

namespace {

void add_run_selection(CLI::App* app, fusekit::cli::RunSelection& s, const std::string& db_help) {
  app->add_option("--db", s.db, db_help)->required();
  app->add_option("--run", s.run, "Run id (default: the latest run in the store)")->check(CLI::PositiveNumber);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fusekit::cli;
  CLI::App app{"fusekit: fused Transformer kernels and the evidence that they are faster"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");

  BenchOptions bench_options;
  for (int i = 0; i < argc; ++i) bench_options.argv.push_back(argv[i]);
  CLI::App* bench_cmd = app.add_subcommand("bench", "Time and trace a suite of cases into a store (needs a GPU)");
  bench_cmd->add_option("--db", bench_options.db, "Store to write (created if missing)")->required();
  bench_cmd
      ->add_option("--suite", bench_options.suite,
                   "Suite to run: demo | ops | attention | models (whole training steps)")
      ->capture_default_str();
  bench_cmd->add_option("--op", bench_options.op,
                        "One operator instead of a suite (" + operator_list() + "); needs --shape and --dtype");
  bench_cmd->add_option("--shape", bench_options.shape,
                        "With --op: the operator's shape (" + operator_shapes() + "), e.g. 16384x1024");
  bench_cmd->add_option(
      "--dtype", bench_options.dtype,
      "fp32 | fp16 | bf16: with --op, the case's dtype; with --suite ops, run the suite in this dtype only");
  bench_cmd->add_flag("--backward", bench_options.backward, "With --op: time forward + backward");
  bench_cmd
      ->add_option("--ops", bench_options.ops,
                   "With --suite: only these operators (comma-separated); NAME:DTYPE runs one in that dtype only, "
                   "NAME@SHAPE at that shape only, e.g. --suite models --ops bert_step,swin_step:fp16@swin-t:b128")
      ->delimiter(',');
  bench_cmd
      ->add_option("--peers", bench_options.peers,
                   "With the ops suite: a peers script (scripts/peers/ops.py) run traced into the same run")
      ->check(CLI::ExistingFile);
  bench_cmd->add_option("--label", bench_options.label, "Label stored with the run");
  bench_cmd->add_option("--warmup", bench_options.warmup, "Warm-up repetitions per case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench_cmd
      ->add_option("--warmup-ms", bench_options.warmup_ms,
                   "Then more warm-up repetitions until this many milliseconds of device time have passed")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  bench_cmd->add_option("--reps", bench_options.repetitions, "Timed repetitions per case")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  bench_cmd
      ->add_option("--sample-us", bench_options.sample_us,
                   "Each timed sample: back-to-back repetitions between two events spanning at least this many "
                   "microseconds of device time (0: one repetition a sample)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  bench_cmd->add_option("--traced-reps", bench_options.traced_repetitions, "Traced repetitions per case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench_cmd->add_flag("--allow-dropped", bench_options.allow_dropped, "Accept a trace with dropped records");

  CasesOptions cases_options;
  CLI::App* cases_cmd = app.add_subcommand(
      "cases", "List the cases bench would run, as JSON: the listing a peers script reads (no GPU needed)");
  cases_cmd->add_option("--suite", cases_options.suite, "Suite to list: ops | attention | models")
      ->capture_default_str();
  cases_cmd->add_option("--op", cases_options.op, "One operator (" + operator_list() + "); needs --shape and --dtype");
  cases_cmd->add_option("--shape", cases_options.shape, "With --op: the operator's shape (" + operator_shapes() + ")");
  cases_cmd->add_option("--dtype", cases_options.dtype,
                        "fp32 | fp16 | bf16: with --op, the case's dtype; with --suite, the suite in this dtype only");
  cases_cmd->add_flag("--backward", cases_options.backward, "With --op: forward + backward");
  cases_cmd
      ->add_option("--ops", cases_options.ops,
                   "With --suite: only these operators (comma-separated); NAME:DTYPE: that dtype only; "
                   "NAME@SHAPE: that shape only")
      ->delimiter(',');
  cases_cmd->add_option("-o,--output", cases_options.output, "Output file (default: standard output)");

  TraceOptions trace_options;
  CLI::App* trace_cmd =
      app.add_subcommand("trace", "Trace an unmodified CUDA program: fusekit trace --db out.db -- cmd args...");
  trace_cmd->add_option("--db", trace_options.db, "Store to write (created if missing)")->required();
  trace_cmd->add_option("--label", trace_options.label, "Label stored with the run");
  trace_cmd->add_option("--flush-ms", trace_options.flush_ms, "Milliseconds between flushes into the store")
      ->check(CLI::Range(10, 600000))
      ->capture_default_str();
  trace_cmd->add_flag("--allow-dropped", trace_options.allow_dropped, "Accept a trace with dropped records");
  trace_cmd->add_option("command", trace_options.command, "The program and its arguments, after --")->required();

  SummaryOptions summary_options;
  CLI::App* summary_cmd = app.add_subcommand("summary", "Kernel and NVTX range tables of a run, like nsys stats");
  add_run_selection(summary_cmd, summary_options.source, "Store to read");
  summary_cmd->add_option("--range", summary_options.range, "Only kernels inside NVTX ranges of this name");
  summary_cmd->add_flag("--short-names", summary_options.short_names, "Group kernels by short name");
  summary_cmd->add_option("--top", summary_options.top, "Rows per table")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  summary_cmd
      ->add_flag("--project-ranges{unranged}", summary_options.project_ranges,
                 "Place kernels launched from threads with no open NVTX range (PyTorch's autograd thread) in the "
                 "innermost range their process had open at the launch; =all: every kernel that way")
      ->check(CLI::IsMember({"none", "unranged", "all"}));
  summary_cmd->add_flag("--categories", summary_options.categories,
                        "GPU time of each case's traced repetitions (or of the ranges named by --range) by kernel "
                        "category and by nested range (forward, backward, optimizer, layers), variants side by side");

  CompareOptions compare_options;
  CLI::App* compare_cmd =
      app.add_subcommand("compare", "Speedup per case and per-kernel diff of two runs, or of two variants in one run");
  add_run_selection(compare_cmd, compare_options.a, "Store of run A");
  compare_cmd->add_option("--against", compare_options.b.db, "Store of run B (its latest run unless --against-run)");
  compare_cmd->add_option("--against-run", compare_options.b.run, "Run id of B")->check(CLI::PositiveNumber);
  compare_cmd->add_option("--variants", compare_options.variants,
                          "Two variants of run A to compare, e.g. baseline,fused");
  compare_cmd->add_flag("--markdown", compare_options.markdown, "Print Markdown tables");

  ReportOptions report_options;
  CLI::App* report_cmd = app.add_subcommand("report", "Write a run's report as CSV, HTML, Markdown or JSON");
  add_run_selection(report_cmd, report_options.source, "Store to read");
  report_cmd->add_option("--format", report_options.format, "csv | html | md | json")
      ->required()
      ->check(CLI::IsMember({"csv", "html", "md", "json"}));
  report_cmd
      ->add_option("--table", report_options.table,
                   "For csv: cases | cases-wide (a row per case, the variants as columns) | kernels | ranges | "
                   "categories (GPU time per case and variant by kernel category) | step-ranges (by nested range)")
      ->check(CLI::IsMember({"cases", "cases-wide", "kernels", "ranges", "categories", "step-ranges"}))
      ->capture_default_str();
  report_cmd
      ->add_flag("--project-ranges{unranged}", report_options.project_ranges,
                 "Range table: place kernels launched from threads with no open NVTX range by time (the default for "
                 "runs of the models suite); =all: every kernel; =none: the launching thread's ranges only")
      ->check(CLI::IsMember({"none", "unranged", "all"}));
  report_cmd->add_option("-o,--output", report_options.output, "Output file (default: standard output)");
  report_cmd
      ->add_option("--history", report_options.history,
                   "For html: more stores (repeatable) whose runs on the same GPU join the charts of each case's "
                   "median over the runs; the report's own store's other runs always do")
      ->check(CLI::ExistingFile);

  ExportOptions export_options;
  CLI::App* export_cmd = app.add_subcommand("export", "Write a run's trace as Chrome trace JSON (opens in Perfetto)");
  add_run_selection(export_cmd, export_options.source, "Store to read");
  export_cmd->add_option("-o,--output", export_options.output, "Output file (default: standard output)");

  IndexOptions index_options;
  CLI::App* index_cmd = app.add_subcommand("index", "Write the index page of a folder of reports (HTML)");
  index_cmd
      ->add_option("entries", index_options.entries,
                   "REPORT=STORE[#RUN] pairs: a report's address and its store (its run RUN; default: the latest)")
      ->required();
  index_cmd->add_option("-o,--output", index_options.output, "Output file (default: standard output)");

  GateOptions gate_options;
  CLI::App* gate_cmd =
      app.add_subcommand("gate", "Fail (exit 1) if a case of the candidate is significantly slower than the baseline");
  gate_cmd->add_option("--baseline", gate_options.baseline.db, "Baseline store")->required();
  gate_cmd->add_option("--baseline-run", gate_options.baseline.run, "Baseline run id (default: latest)")
      ->check(CLI::PositiveNumber);
  gate_cmd
      ->add_option("--baseline-runs", gate_options.baseline_runs,
                   "History baseline: pool the samples of the N newest finished runs of --baseline on the "
                   "candidate's GPU")
      ->check(CLI::Range(1, 10000));
  gate_cmd->add_option("--baseline-commit", gate_options.baseline_commit,
                       "Baseline: the newest finished run of --baseline at this commit (a prefix of 7+ digits)");
  gate_cmd->add_option("--candidate", gate_options.candidate.db, "Candidate store")->required();
  gate_cmd->add_option("--candidate-run", gate_options.candidate.run, "Candidate run id (default: latest)")
      ->check(CLI::PositiveNumber);
  gate_cmd
      ->add_option("--threshold", gate_options.threshold,
                   "Smallest slowdown of the median that counts, e.g. 5% or 0.05")
      ->capture_default_str();
  gate_cmd->add_option("--alpha", gate_options.alpha, "Significance level of the Mann-Whitney U test")
      ->capture_default_str();
  gate_cmd->add_option("--min-samples", gate_options.min_samples, "Fewest samples per side to test a case")
      ->check(CLI::Range(2, 1000000))
      ->capture_default_str();
  gate_cmd->add_flag("--allow-too-few-samples", gate_options.allow_too_few_samples,
                     "Pass even if some cases have too few samples to test (by default that fails)");
  gate_cmd->add_flag("--every-variant", gate_options.every_variant,
                     "Let every variant fail the gate (by default only fusekit's fused variants do; the libtorch "
                     "baseline, peers and references are shown as not gated)");
  gate_cmd->add_flag("--kernels", gate_options.kernels,
                     "Also test each case's kernels, one sample per traced repetition (shown, never failing)");
  gate_cmd->add_flag("--ranges", gate_options.ranges,
                     "Also test each case's NVTX ranges, GPU time per traced repetition (shown, never failing)");
  gate_cmd->add_option("--range-depth", gate_options.range_depth, "Range names below \"rep\" that tell ranges apart")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  gate_cmd->add_option("--markdown", gate_options.markdown_output, "Also write the table as Markdown to this file");
  gate_cmd->add_option("--regressed-ops", gate_options.regressed_ops_output,
                       "Write the operators of the regressed cases to this file, one per line (empty: none)");

  // An unknown first word is an unknown subcommand (CLI11 would say "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "fusekit: unknown subcommand '%s' (available: %s; see 'fusekit --help')\n", argv[1],
                   names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string where =
        app.get_subcommands().empty() ? "fusekit" : "fusekit " + app.get_subcommands().front()->get_name();
    std::fprintf(stderr, "%s: %s (see '%s --help')\n", where.c_str(), e.what(), where.c_str());
    return 2;
  }

  try {
    if (*bench_cmd) return bench(bench_options);
    if (*cases_cmd) return list_cases(cases_options);
    if (*trace_cmd) return trace(trace_options);
    if (*summary_cmd) return summary(summary_options);
    if (*compare_cmd) {
      if (compare_options.b.db.empty() == compare_options.variants.empty()) {
        std::fprintf(stderr,
                     "fusekit compare: give either --against B.db or --variants A,B (see 'fusekit compare --help')\n");
        return 2;
      }
      return compare(compare_options);
    }
    if (*report_cmd) return report(report_options);
    if (*export_cmd) return export_trace(export_options);
    if (*index_cmd) return index(index_options);
    if (*gate_cmd) return gate(gate_options);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fusekit: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusekit: %s\n", e.what());
    return 1;
  }
  return 2;
}
