// Side-by-side comparisons: the same cases in two runs, two variants of each case in one run, and the
// kernel tables of two runs.
//
// Case medians are taken from the samples (the stored median_ns only where a case has no samples), so a
// comparison never depends on who filled the derived fields. Kernels are joined by name over both sides:
// a kernel that appears or disappears is often the change a reader is looking for.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "profiler/summary.h"
#include "reports/run_report.h"

namespace fusekit::reports {

struct CaseComparison {
  std::string name;
  std::string variant_a, variant_b;
  double median_a_ns = 0, median_b_ns = 0;
  double speedup = 0;  // median_a / median_b: above 1 means b is faster
};

// Cases present in both runs, matched by (name, variant), in the order of `a`.
std::vector<CaseComparison> compare_runs(const std::vector<CaseResult>& a, const std::vector<CaseResult>& b);

// Within one run: every name that has both variants, in order of first appearance.
std::vector<CaseComparison> compare_variants(const std::vector<CaseResult>& cases, const std::string& variant_a,
                                             const std::string& variant_b);

struct KernelDiff {
  std::string name;
  uint64_t total_a_ns = 0, total_b_ns = 0;
  uint64_t instances_a = 0, instances_b = 0;
  double avg_a_ns = 0, avg_b_ns = 0;
};

// Full outer join by kernel name (zeros on the side that lacks a kernel), sorted by |total_b - total_a|,
// largest first, then by name.
std::vector<KernelDiff> diff_kernels(const std::vector<profiler::KernelStats>& a,
                                     const std::vector<profiler::KernelStats>& b);

// Columns: Median A (us), Median B (us), Speedup, Variant ("a" or "a -> b"), Case.
std::string comparison_table_text(const std::vector<CaseComparison>& comparisons);
std::string comparison_table_markdown(const std::vector<CaseComparison>& comparisons);

// Columns: Total A (us), Total B (us), Delta (us), Delta (%), Instances A, Instances B, Avg A (us), Avg B (us), Name.
std::string kernel_diff_table_text(const std::vector<KernelDiff>& diffs,
                                   size_t top = std::numeric_limits<size_t>::max());
std::string kernel_diff_table_markdown(const std::vector<KernelDiff>& diffs,
                                       size_t top = std::numeric_limits<size_t>::max());

}  // namespace fusekit::reports
