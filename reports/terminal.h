// Tables for the terminal, laid out like `nsys stats`: right-aligned numbers, the name last.
#pragma once

#include <string>
#include <vector>

#include "profiler/summary.h"
#include "reports/gate.h"
#include "reports/run_report.h"

namespace fusekit::reports {

// Columns: Time (%), Total Time (ns), Instances, Avg (ns), Med (ns), Min (ns), Max (ns), StdDev (ns), Name.
std::string kernel_table_text(const std::vector<profiler::KernelStats>& kernels, size_t top);
// Columns: Wall (us), GPU extent (us), GPU busy (us), Idle (%), Instances, Kernels, Name, and a
// legend of the time columns (with a line on busy time above wall time where a range shows it).
std::string range_table_text(const std::vector<profiler::RangeStats>& ranges, size_t top);
// Columns: Median (us), Q1, Q3, Samples, Speedup, GB/s, % of copy ceiling, Variant, Case.
std::string case_table_text(const std::vector<CaseResult>& cases);
// The gate's verdicts. Columns: Baseline (us), Candidate (us), Change (%), p-value, Samples, Verdict,
// Variant, Case; then a count per verdict and the cases found in one run only; with kernel_rows_requested,
// each case's kernel rows under its name.
std::string gate_table_text(const GateResult& result);

// GPU time of the cases' traced repetitions by kernel category (markdown.h's category_table), then
// its legend.
std::string category_table_text(const std::vector<CaseBreakdown>& breakdowns, profiler::RangeProjection projection);
// The same time by nested range, a table per case (markdown.h's nested_range_tables, indented); ""
// where no case holds nested ranges.
std::string nested_range_tables_text(const std::vector<CaseBreakdown>& breakdowns);

// Lays out rows (the first is the header) in columns; columns before `left_from` are right-aligned.
std::string aligned_table(const std::vector<std::vector<std::string>>& rows, size_t left_from);

std::string format_fixed(double value, int decimals);

}  // namespace fusekit::reports
