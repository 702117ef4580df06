#include "reports/markdown.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string_view>

#include "reports/terminal.h"

namespace fusekit::reports {
namespace {

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string or_dash(const std::string& text) { return text.empty() ? "-" : text; }

std::string one_line(std::string_view text) {
  std::string out(text);
  std::replace_if(
      out.begin(), out.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  return out;
}

// A cell's text with the punctuation that Markdown or a GFM table would act on backslash-escaped.
std::string markdown_text(std::string_view text) {
  std::string out;
  for (char c : one_line(text)) {
    if (std::string_view("\\|*_<>[]`~&#!").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string markdown_table(const ReportTable& table) {
  std::string out = "|";
  for (const std::string& h : table.header) out += " " + markdown_text(h) + " |";
  out += "\n|";
  for (size_t c = 0; c < table.header.size(); ++c) out += c < table.text_from ? " ---: |" : " --- |";
  out += "\n";
  for (const auto& row : table.rows) {
    out += "|";
    for (size_t c = 0; c < row.size(); ++c)
      out += " " + (c + 1 == row.size() ? markdown_code(row[c]) : markdown_text(row[c])) + " |";
    out += "\n";
  }
  if (!table.note.empty()) out += "\n" + markdown_text(table.note) + "\n";
  return out;
}

std::string traced(const profiler::RunTotals& t) {
  if (t.wall_ns == 0) return "nothing";
  return format_microseconds(static_cast<double>(t.wall_ns)) + " us wall, " +
         format_microseconds(static_cast<double>(t.busy_ns)) + " us GPU busy (" + fixed(100 * t.idle_fraction, 1) +
         " % idle); " + std::to_string(t.kernels) + " kernels, " + std::to_string(t.memcpys) + " copies (" +
         std::to_string(t.memcpy_bytes) + " bytes), " + std::to_string(t.memsets) + " memsets, " +
         std::to_string(t.api_calls) + " API calls, " + std::to_string(t.ranges) + " ranges";
}

}  // namespace

// A code span that survives backticks in the text; '|' is escaped as GFM tables require, even in code.
std::string markdown_code(std::string_view text) {
  std::string body = one_line(text);
  size_t longest = 0, run = 0;  // the longest run of backticks in the text
  for (char c : body) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  if (!body.empty() && (body.front() == '`' || body.back() == '`' || (body.front() == ' ' && body.back() == ' ')))
    body = " " + body + " ";
  std::string out;
  for (char c : body) {
    if (c == '|') out += '\\';
    out += c;
  }
  const std::string fence(longest + 1, '`');
  return fence + out + fence;
}

std::string markdown_table(const std::vector<std::vector<std::string>>& rows, size_t left_from) {
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    out += "|";
    for (const std::string& cell : rows[r]) out += " " + cell + " |";
    out += "\n";
    if (r == 0) {
      out += "|";
      for (size_t c = 0; c < rows[0].size(); ++c) out += c < left_from ? " ---: |" : " --- |";
      out += "\n";
    }
  }
  return out;
}

std::string format_microseconds(double ns) {
  if (!std::isfinite(ns)) return "-";
  const double us = ns / 1e3;
  const double magnitude = std::fabs(us);
  return fixed(us, magnitude < 10 ? 3 : magnitude < 1000 ? 2 : 1);
}

ReportTable case_table(const RunReport& report) {
  ReportTable t;
  t.header = {"Median (us)",       "Q1–Q3 (us)", "Samples", "Speedup", "GB/s",
              "% of copy ceiling", "TFLOP/s",    "Variant", "Case"};
  t.text_from = 7;
  const auto optional = [](const std::optional<double>& v, double scale, int decimals, const char* unit = "") {
    return v ? fixed(*v * scale, decimals) + unit : std::string("-");
  };
  // Peak device memory, a column only where a case measured it (the models suite's steps).
  const bool any_memory = std::any_of(report.cases.begin(), report.cases.end(),
                                      [](const CaseResult& c) { return peak_memory_mib(c).has_value(); });
  // Training steps: items (sequences or images) a second, from the batch in the case's shape.
  const bool any_throughput = std::any_of(report.cases.begin(), report.cases.end(),
                                          [](const CaseResult& c) { return items_per_second(c).has_value(); });
  if (any_memory) {
    t.header.insert(t.header.begin() + 7, "Peak memory (MiB)");
    t.text_from = 8;
  }
  if (any_throughput) {
    t.header.insert(t.header.begin() + t.text_from, "Items/s");
    ++t.text_from;
  }
  for (const CaseResult& c : report.cases) {
    t.rows.push_back({format_microseconds(c.median_ns),
                      format_microseconds(c.q1_ns) + "–" + format_microseconds(c.q3_ns),
                      std::to_string(c.samples_ns.size()), optional(c.speedup, 1, 2, "x"),
                      optional(c.bandwidth_bytes_per_s, 1e-9, 1), optional(c.bandwidth_percent, 1, 1),
                      optional(c.flops_per_s, 1e-12, 2), c.info.variant, c.info.name});
    if (any_memory) {
      t.rows.back().insert(t.rows.back().begin() + 7, optional(peak_memory_mib(c), 1, 0));
    }
    if (any_throughput)
      t.rows.back().insert(t.rows.back().begin() + t.text_from - 1, optional(items_per_second(c), 1, 1));
  }
  return t;
}

ReportTable kernel_table(const RunReport& report) {
  ReportTable t;
  t.header = {"Time (%)", "Total Time (ns)", "Instances",   "Avg (ns)", "Med (ns)",
              "Min (ns)", "Max (ns)",        "StdDev (ns)", "Name"};
  t.text_from = 8;
  const auto& kernels = report.kernels;
  for (size_t i = 0; i < kernels.size() && i < kTopKernels; ++i) {
    const profiler::KernelStats& k = kernels[i];
    t.rows.push_back({fixed(k.time_percent, 1), std::to_string(k.total_ns), std::to_string(k.instances),
                      fixed(k.avg_ns, 1), fixed(k.med_ns, 1), std::to_string(k.min_ns), std::to_string(k.max_ns),
                      fixed(k.stddev_ns, 1), k.name});
  }
  if (kernels.size() > kTopKernels) {
    double rest = 0;
    for (size_t i = kTopKernels; i < kernels.size(); ++i) rest += kernels[i].time_percent;
    t.note = std::to_string(kernels.size() - kTopKernels) + " more kernels, " + fixed(rest, 1) +
             " % of kernel time, are not shown.";
  }
  return t;
}

ReportTable range_table(const RunReport& report) {
  ReportTable t;
  t.header = {"Wall (us)", "GPU busy (us)", "Idle (%)", "Instances", "Kernels", "Kernel time (us)", "Range"};
  t.text_from = 6;
  for (const profiler::RangeStats& r : report.ranges) {
    t.rows.push_back({format_microseconds(static_cast<double>(r.wall_ns)),
                      format_microseconds(static_cast<double>(r.busy_ns)), fixed(100 * r.idle_fraction, 1),
                      std::to_string(r.instances), std::to_string(r.kernels),
                      format_microseconds(static_cast<double>(r.kernel_ns)), r.name});
  }
  return t;
}

std::string share_cell(uint64_t ns, uint64_t total_ns, uint64_t repetitions) {
  if (ns == 0 || total_ns == 0) return "-";
  std::string cell = fixed(100.0 * static_cast<double>(ns) / static_cast<double>(total_ns), 1);
  if (repetitions > 0)
    cell += " (" + format_microseconds(static_cast<double>(ns) / static_cast<double>(repetitions)) + ")";
  return cell;
}

ReportTable category_table(const std::vector<CaseBreakdown>& breakdowns) {
  std::vector<profiler::KernelCategory> shown;
  for (profiler::KernelCategory c : profiler::kKernelCategories) {
    if (std::any_of(breakdowns.begin(), breakdowns.end(),
                    [&](const CaseBreakdown& b) { return b.breakdown.category_ns[static_cast<size_t>(c)] > 0; }))
      shown.push_back(c);
  }
  ReportTable t;
  t.header = {"Reps", "GPU (us/rep)"};
  for (profiler::KernelCategory c : shown) t.header.push_back(std::string(profiler::category_name(c)));
  t.header.push_back("Variant");
  t.header.push_back("Case");
  t.text_from = t.header.size() - 2;
  for (const CaseBreakdown& b : breakdowns) {
    const profiler::RangeBreakdown& d = b.breakdown;
    std::vector<std::string> row = {
        d.repetitions > 0 ? std::to_string(d.repetitions) : "-",
        d.repetitions > 0 ? format_microseconds(static_cast<double>(d.gpu_ns) / static_cast<double>(d.repetitions))
                          : "-"};
    for (profiler::KernelCategory c : shown)
      row.push_back(share_cell(d.category_ns[static_cast<size_t>(c)], d.gpu_ns, d.repetitions));
    row.push_back(b.variant);
    row.push_back(b.name);
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::vector<TitledTable> nested_range_tables(const std::vector<CaseBreakdown>& breakdowns, bool indent) {
  // The variants of each case, in the order of the breakdowns.
  std::vector<std::string> names;
  std::map<std::string, std::vector<const CaseBreakdown*>> variants;
  for (const CaseBreakdown& b : breakdowns) {
    if (!variants.count(b.name)) names.push_back(b.name);
    variants[b.name].push_back(&b);
  }
  std::vector<TitledTable> out;
  for (const std::string& name : names) {
    const std::vector<const CaseBreakdown*>& cases = variants[name];
    // Every path of any variant, each variant's in its order; a path another variant lacks goes
    // after the paths it follows there.
    std::vector<std::vector<std::string>> paths;
    for (const CaseBreakdown* b : cases) {
      auto at = paths.begin();
      for (const profiler::NestedRangeTime& n : b->breakdown.nested) {
        auto found = std::find(paths.begin(), paths.end(), n.path);
        at = found != paths.end() ? found + 1 : paths.insert(at, n.path) + 1;
      }
    }
    if (paths.empty()) continue;
    TitledTable titled{name, {}};
    ReportTable& t = titled.table;
    for (const CaseBreakdown* b : cases) t.header.push_back(b->variant);
    t.header.push_back("Range");
    t.text_from = cases.size();
    auto time_of = [](const CaseBreakdown& b, const std::vector<std::string>& path) -> uint64_t {
      for (const profiler::NestedRangeTime& n : b.breakdown.nested) {
        if (n.path == path) return n.gpu_ns;
      }
      return 0;
    };
    for (const std::vector<std::string>& path : paths) {
      std::vector<std::string> row;
      for (const CaseBreakdown* b : cases)
        row.push_back(share_cell(time_of(*b, path), b->breakdown.gpu_ns, b->breakdown.repetitions));
      std::string label;
      if (indent) {
        label = std::string(2 * (path.size() - 1), ' ') + path.back();
      } else {
        for (const std::string& p : path) label += (label.empty() ? "" : " > ") + p;
      }
      row.push_back(label);
      t.rows.push_back(std::move(row));
    }
    std::vector<std::string> rest;
    for (const CaseBreakdown* b : cases) {
      uint64_t nested = 0;
      for (const profiler::NestedRangeTime& n : b->breakdown.nested) nested += n.path.size() == 1 ? n.gpu_ns : 0;
      rest.push_back(share_cell(b->breakdown.gpu_ns - std::min(nested, b->breakdown.gpu_ns), b->breakdown.gpu_ns,
                                b->breakdown.repetitions));
    }
    rest.push_back("(in no nested range)");
    t.rows.push_back(std::move(rest));
    out.push_back(std::move(titled));
  }
  return out;
}

std::string category_legend(profiler::RangeProjection projection) {
  std::string out =
      "Each case's traced repetitions (the kernels, copies and memsets inside its range \"<case> [<variant>]\") "
      "by kernel category, from the kernel's name. Cells: % of the case's GPU time (summed durations), in "
      "parentheses microseconds per repetition where the case's repetitions are marked (\"rep\" ranges). ";
  out += projection == profiler::RangeProjection::all
             ? "Every launch is placed by time in the innermost range its process had open, on any thread. "
             : "A launch from a thread with no open range (PyTorch's autograd thread) is placed by time in the "
               "innermost range its process had open. ";
  return out +
         "copy/cast also holds fills, concatenation, gathers, scatters, indexing and sorts (an embedding's "
         "backward).\n";
}

std::vector<std::pair<std::string, std::string>> run_metadata(const RunReport& report) {
  const RunInfo& r = report.run;
  std::string gpu = or_dash(r.gpu_name);
  if (!r.gpu_uuid.empty()) gpu += " (" + r.gpu_uuid + ")";
  return {
      {"Run", std::to_string(r.id) + (r.label.empty() ? "" : ": " + r.label)},
      {"Status", or_dash(r.status) + ", exit code " + std::to_string(r.exit_code)},
      {"Started", or_dash(r.started_at)},
      {"Finished", or_dash(r.finished_at)},
      {"Commit", or_dash(r.git_commit)},
      {"Host", or_dash(r.host)},
      {"GPU", gpu},
      {"Driver", or_dash(r.driver_version)},
      {"CUDA", or_dash(r.cuda_version)},
      {"libtorch", or_dash(r.libtorch_version)},
      {"Command line", or_dash(r.command_line)},
      {"Dropped records", std::to_string(r.dropped_records)},
      {"Copy ceiling", r.copy_ceiling_bytes_per_second > 0 ? fixed(r.copy_ceiling_bytes_per_second / 1e9, 1) + " GB/s"
                                                           : "not measured"},
      {"Traced", traced(report.totals)},
  };
}

std::string report_markdown(const RunReport& report) {
  std::string out = "# fusekit run " + std::to_string(report.run.id);
  if (!report.run.label.empty()) out += ": " + markdown_text(report.run.label);
  out += "\n\n| Field | Value |\n| --- | --- |\n";
  for (const auto& [field, value] : run_metadata(report)) {
    const bool code = field == "Commit" || field == "Command line";
    out += "| " + field + " | " + (code && value != "-" ? markdown_code(value) : markdown_text(value)) + " |\n";
  }
  if (report.run.dropped_records > 0) {
    out += "\n**" + std::to_string(report.run.dropped_records) +
           " records were dropped while tracing: the kernel and range tables undercount.**\n";
  }
  const auto section = [&](const char* title, const ReportTable& table, const char* none) {
    out +=
        std::string("\n## ") + title + "\n\n" + (table.rows.empty() ? std::string(none) + "\n" : markdown_table(table));
  };
  section("Cases", case_table(report), "No cases in this run.");
  section("Kernels", kernel_table(report), "No kernels were traced in this run.");
  section("Ranges", range_table(report), "No NVTX ranges were traced in this run.");
  if (report.range_projection != profiler::RangeProjection::none && !report.ranges.empty()) {
    out +=
        "\nKernels launched from a thread with no open range are counted in the range their process had open "
        "at the launch (" +
        std::string(profiler::projection_name(report.range_projection)) + " projection).\n";
  }
  if (!report.case_breakdowns.empty()) {
    out += "\n## GPU time by kernel category\n\n" + markdown_text(category_legend(report.breakdown_projection)) +
           "\n\n" + markdown_table(category_table(report.case_breakdowns));
    const std::vector<TitledTable> nested = nested_range_tables(report.case_breakdowns, false);
    if (!nested.empty()) {
      out +=
          "\n## GPU time by step range\n\nThe same time by the NVTX ranges nested in each repetition, "
          "including the ranges nested deeper; cells as above.\n";
      for (const TitledTable& t : nested) out += "\n### " + markdown_code(t.title) + "\n\n" + markdown_table(t.table);
    }
  }
  return out;
}

namespace {

std::string format_change(double change) {
  if (!std::isfinite(change)) return "-";
  return (change >= 0 ? "+" : "") + format_fixed(100 * change, 1);
}

std::string format_p_value(double p) {
  if (std::isnan(p)) return "-";
  if (p >= 1e-3) return format_fixed(p, 3);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", p);
  return buf;
}

}  // namespace

std::vector<std::vector<std::string>> gate_table_rows(const GateResult& result, bool markdown) {
  std::vector<std::vector<std::string>> rows = {
      {"Baseline (us)", "Candidate (us)", "Change (%)", "p-value", "Samples", "Verdict", "Variant", "Case"}};
  for (const GateRow& r : result.rows) {
    std::string verdict = verdict_name(r.verdict);
    if (markdown && r.fails()) verdict = "**" + verdict + "**";
    if (!r.gated) verdict += " (not gated)";
    rows.push_back({format_microseconds(r.baseline_median_ns), format_microseconds(r.candidate_median_ns),
                    format_change(r.change), format_p_value(r.p_value),
                    std::to_string(r.baseline_n) + "/" + std::to_string(r.candidate_n), verdict,
                    markdown ? markdown_code(r.variant) : r.variant, markdown ? markdown_code(r.name) : r.name});
  }
  return rows;
}

std::vector<std::vector<std::string>> gate_kernel_rows(const CaseKernelGate& gate, size_t limit, bool markdown,
                                                       const char* what) {
  std::vector<std::vector<std::string>> rows = {
      {"Baseline (us/rep)", "Candidate (us/rep)", "Moved (us/rep)", "Change (%)", "p-value", "Reps", "Verdict", what}};
  for (size_t i = 0; i < gate.rows.size() && i < limit; ++i) {
    const KernelGateRow& k = gate.rows[i];
    std::string verdict = verdict_name(k.verdict);
    if (markdown && k.verdict == Verdict::regressed) verdict = "**" + verdict + "**";
    const std::string change = k.baseline_mean_ns == 0    ? "new"
                               : k.candidate_mean_ns == 0 ? "gone"
                                                          : format_change(k.change);
    const double moved = k.moved_ns();
    rows.push_back({format_microseconds(k.baseline_mean_ns), format_microseconds(k.candidate_mean_ns),
                    (moved >= 0 ? "+" : "-") + format_microseconds(std::abs(moved)), change, format_p_value(k.p_value),
                    std::to_string(k.baseline_n) + "/" + std::to_string(k.candidate_n), verdict,
                    markdown ? markdown_code(k.kernel) : k.kernel});
  }
  return rows;
}

std::string gate_kernel_note(const CaseKernelGate& gate) {
  if (gate.baseline_repetitions == 0 && gate.candidate_repetitions == 0) return "no rep ranges in either run";
  if (gate.baseline_repetitions == 0) return "no rep ranges in the baseline";
  if (gate.candidate_repetitions == 0) return "no rep ranges in the candidate";
  if (gate.rows.empty()) return "no kernels in the traced repetitions";
  return "";
}

std::string gate_verdict_counts(const GateResult& result) {
  std::map<Verdict, size_t> gated, reference;
  for (const GateRow& r : result.rows) ++(r.gated ? gated : reference)[r.verdict];
  const auto counts = [](std::map<Verdict, size_t>& count) {
    std::string out;
    for (Verdict v : {Verdict::regressed, Verdict::improved, Verdict::unchanged, Verdict::too_few_samples}) {
      out += (out.empty() ? "" : ", ") + std::to_string(count[v]) + " " + verdict_name(v);
    }
    return out;
  };
  std::string out = counts(gated);
  if (!reference.empty())
    out += "; not gated (libtorch, peers and references: shown, fail nothing): " + counts(reference);
  out += "\n";
  const auto not_timed = [&](const std::map<std::string, size_t>& what, const std::string& kind) {
    if (what.empty()) return;
    size_t cases = 0;
    std::string names;
    for (const auto& [name, n] : what) {
      cases += n;
      names += (names.empty() ? "" : ", ") + name;
    }
    out += "not timed by the candidate: " + std::to_string(cases) + " case(s) of the baseline in " +
           std::to_string(what.size()) + " " + kind + " (" + names + ")\n";
  };
  not_timed(result.unmeasured_operators, "other operator(s)");
  not_timed(result.unmeasured_variants, "variant(s) it ran nowhere");
  return out;
}

std::string gate_table_markdown(const GateResult& result) {
  std::string out;
  for (const std::string& w : result.condition_warnings) out += "> **Warning:** " + w + "\n>\n";
  if (!out.empty()) out += "\n";
  out += markdown_table(gate_table_rows(result, true), 5) + "\n" + gate_verdict_counts(result);
  auto list = [&](const char* title, const std::vector<std::string>& cases) {
    if (cases.empty()) return;
    out += std::string("\n**") + title + ":**\n\n";
    for (const std::string& c : cases) out += "- " + markdown_code(c) + "\n";
  };
  list("Only in baseline", result.only_in_baseline);
  list("Only in candidate", result.only_in_candidate);
  list("Timed while the GPU throttled", result.throttled_cases);
  // The regressed cases' kernels that moved most, then (on request) every case's kernels.
  for (size_t i = 0; i < result.kernels.size() && i < result.rows.size(); ++i) {
    if (!result.rows[i].fails()) continue;
    const CaseKernelGate& gate = result.kernels[i];
    out += "\n**Kernels that moved most in " + markdown_code(gate.name + " [" + gate.variant + "]") +
           "** (time per traced repetition):\n\n";
    const std::string note = gate_kernel_note(gate);
    out += note.empty() ? markdown_table(gate_kernel_rows(gate, kGateTopKernels, true), 6) : note + "\n";
  }
  if (result.kernel_rows_requested) {
    out += "\n<details><summary>Kernels per case (one sample per traced repetition)</summary>\n";
    for (const CaseKernelGate& gate : result.kernels) {
      out += "\n" + markdown_code(gate.name + " [" + gate.variant + "]") + ", " +
             std::to_string(gate.baseline_repetitions) + "/" + std::to_string(gate.candidate_repetitions) +
             " repetitions:\n\n";
      const std::string note = gate_kernel_note(gate);
      out += note.empty() ? markdown_table(gate_kernel_rows(gate, gate.rows.size(), true), 6) : note + "\n";
    }
    out += "\n</details>\n";
  }
  if (!result.ranges.empty()) {
    out += "\n<details><summary>NVTX ranges per case (GPU time per traced repetition)</summary>\n";
    for (const CaseKernelGate& gate : result.ranges) {
      out += "\n" + markdown_code(gate.name + " [" + gate.variant + "]") + ", " +
             std::to_string(gate.baseline_repetitions) + "/" + std::to_string(gate.candidate_repetitions) +
             " repetitions:\n\n";
      const std::string note = gate_kernel_note(gate);
      out += note.empty() ? markdown_table(gate_kernel_rows(gate, gate.rows.size(), true, "Range"), 6) : note + "\n";
    }
    out += "\n</details>\n";
  }
  return out;
}

}  // namespace fusekit::reports
