// The run report in GitHub Markdown: run metadata, then the tables of cases, kernels and ranges.
//
// The tables are built once as rows of text (ReportTable) and shared with the HTML writer, so both
// reports show the same columns and the same rounding. Names, which hold `<`, `*` and `|` (templates,
// pointers), go into code spans; other cells have Markdown's punctuation backslash-escaped.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reports/gate.h"
#include "reports/run_report.h"

namespace fusekit::reports {

std::string report_markdown(const RunReport& report);

// Columns before `text_from` hold numbers (right-aligned), the others text; the last column holds names.
struct ReportTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  size_t text_from = 0;
  std::string note;  // a line below the table ("7 more kernels ..."), or empty
};

inline constexpr size_t kTopKernels = 20;

// Median (us), Q1–Q3 (us), Samples, Speedup, GB/s, % of copy ceiling, TFLOP/s, Variant, Case.
ReportTable case_table(const RunReport& report);
// The `nsys stats` columns, the top kTopKernels kernels by total time.
ReportTable kernel_table(const RunReport& report);
// Wall (us), GPU busy (us), Idle (%), Instances, Kernels, Kernel time (us), Range.
ReportTable range_table(const RunReport& report);
// GPU time of the cases' traced repetitions by kernel category: a row per case and variant with
// Reps (the runner's "rep" ranges; "-" where the case range holds none), GPU (us/rep), then a
// column named after each category that any row has, "<% of the case's GPU time> (<us per
// repetition>)", Variant, Case.
ReportTable category_table(const std::vector<CaseBreakdown>& breakdowns);
struct TitledTable {
  std::string title;
  ReportTable table;
};
// Per case whose traced repetitions hold nested ranges (a step's forward, backward, optimizer,
// layers): a row per nested range path, in the order they ran, and a last row for the time in no
// nested range; a column per variant (named after it), cells as category_table's. The path is written
// "a > b > c", or with `indent` as its last name indented two spaces a level.
std::vector<TitledTable> nested_range_tables(const std::vector<CaseBreakdown>& breakdowns, bool indent);
// "12.3 (456.78)": the percentage of `total_ns` and microseconds per repetition (only the
// percentage where `repetitions` is 0); "-" for no time.
std::string share_cell(uint64_t ns, uint64_t total_ns, uint64_t repetitions);
// The lines under the category tables: what they count, the projection, what copy/cast holds.
std::string category_legend(profiler::RangeProjection projection);
// (field, value) pairs: run, status, times, commit, host, GPU, versions, command line, dropped records, totals.
std::vector<std::pair<std::string, std::string>> run_metadata(const RunReport& report);
// The gate's verdicts as gate_table_text's columns (regressions in bold), then a count per verdict and
// lists of the cases found in one run only; then, for each regressed case, the kGateTopKernels kernels
// that moved most (where the kernels were gated), and with kernel_rows_requested every case's kernels.
std::string gate_table_markdown(const GateResult& result);
// The gate's table as rows of text (the first is the header), shared by the terminal and Markdown
// writers; `markdown` puts names into code spans and regressions in bold.
std::vector<std::vector<std::string>> gate_table_rows(const GateResult& result, bool markdown);
// How many kernels the Markdown lists for each regressed case: those that moved most per repetition.
inline constexpr size_t kGateTopKernels = 3;
// A case's kernel rows (the first is the header), at most `limit` of them, in CaseKernelGate's order.
// `what` heads the last column: "Kernel", or "Range" for the rows of GateResult::ranges.
std::vector<std::vector<std::string>> gate_kernel_rows(const CaseKernelGate& gate, size_t limit, bool markdown,
                                                       const char* what = "Kernel");
// Why a case has no kernel rows ("no rep ranges in the baseline", ...), or "" if it has some.
std::string gate_kernel_note(const CaseKernelGate& gate);
// "1 regressed, 2 improved, 3 unchanged, 0 too few samples" and a newline.
std::string gate_verdict_counts(const GateResult& result);

// Nanoseconds as microseconds, with fewer decimals as the value grows (1.234, 123.46, 12345.7); "-"
// if not finite. Every report and table writes times this way.
std::string format_microseconds(double ns);

// `text` as an inline code span that survives a table cell: backticks in the text get a longer
// fence, and '|' is escaped as GitHub tables require, even in code (kernel names hold '<', '|', '`').
std::string markdown_code(std::string_view text);

// A GitHub Markdown table of rows (the first is the header), cells written as given (callers escape
// them); columns before `left_from` are right-aligned.
std::string markdown_table(const std::vector<std::vector<std::string>>& rows, size_t left_from);

}  // namespace fusekit::reports
