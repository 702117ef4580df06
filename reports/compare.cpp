#include "reports/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "reports/markdown.h"
#include "reports/terminal.h"

namespace fusekit::reports {
namespace {
double case_median_ns(const CaseResult& c) {
  return c.samples_ns.empty() ? c.median_ns : profiler::median(c.samples_ns);
}

CaseComparison make_comparison(const CaseResult& a, const CaseResult& b) {
  CaseComparison c;
  c.name = a.info.name;
  c.variant_a = a.info.variant;
  c.variant_b = b.info.variant;
  c.median_a_ns = case_median_ns(a);
  c.median_b_ns = case_median_ns(b);
  c.speedup = c.median_a_ns / c.median_b_ns;
  return c;
}

std::vector<std::vector<std::string>> comparison_rows(const std::vector<CaseComparison>& comparisons, bool markdown) {
  std::vector<std::vector<std::string>> rows = {{"Median A (us)", "Median B (us)", "Speedup", "Variant", "Case"}};
  for (const CaseComparison& c : comparisons) {
    const std::string variant = c.variant_a == c.variant_b ? c.variant_a : c.variant_a + " -> " + c.variant_b;
    rows.push_back({format_microseconds(c.median_a_ns), format_microseconds(c.median_b_ns),
                    std::isfinite(c.speedup) ? format_fixed(c.speedup, 2) + "x" : "-",
                    markdown ? markdown_code(variant) : variant, markdown ? markdown_code(c.name) : c.name});
  }
  return rows;
}

std::vector<std::vector<std::string>> kernel_diff_rows(const std::vector<KernelDiff>& diffs, size_t top,
                                                       bool markdown) {
  std::vector<std::vector<std::string>> rows = {{"Total A (us)", "Total B (us)", "Delta (us)", "Delta (%)",
                                                 "Instances A", "Instances B", "Avg A (us)", "Avg B (us)", "Name"}};
  for (size_t i = 0; i < diffs.size() && i < top; ++i) {
    const KernelDiff& d = diffs[i];
    const auto total_a = static_cast<double>(d.total_a_ns), total_b = static_cast<double>(d.total_b_ns);
    const double delta = total_b - total_a;
    std::string percent = "-";
    if (total_a > 0) percent = (delta >= 0 ? "+" : "") + format_fixed(100.0 * delta / total_a, 1);
    rows.push_back({format_microseconds(total_a), format_microseconds(total_b),
                    (delta >= 0 ? "+" : "") + format_microseconds(delta), percent, std::to_string(d.instances_a),
                    std::to_string(d.instances_b), format_microseconds(d.avg_a_ns), format_microseconds(d.avg_b_ns),
                    markdown ? markdown_code(d.name) : d.name});
  }
  return rows;
}

std::string more_kernels_line(const std::vector<KernelDiff>& diffs, size_t top) {
  return diffs.size() > top ? "(" + std::to_string(diffs.size() - top) + " more kernels)\n" : "";
}

}  // namespace

std::vector<CaseComparison> compare_runs(const std::vector<CaseResult>& a, const std::vector<CaseResult>& b) {
  index_cases(a, "run A");
  const auto b_index = index_cases(b, "run B");
  std::vector<CaseComparison> out;
  for (const CaseResult& c : a) {
    auto it = b_index.find({c.info.name, c.info.variant});
    if (it != b_index.end()) out.push_back(make_comparison(c, *it->second));
  }
  return out;
}

std::vector<CaseComparison> compare_variants(const std::vector<CaseResult>& cases, const std::string& variant_a,
                                             const std::string& variant_b) {
  if (variant_a == variant_b) throw std::invalid_argument("compare_variants: both variants are '" + variant_a + "'");
  const auto index = index_cases(cases, "run");
  std::vector<CaseComparison> out;
  for (const CaseResult& c : cases) {
    if (c.info.variant != variant_a) continue;
    auto it = index.find({c.info.name, variant_b});
    if (it != index.end()) out.push_back(make_comparison(c, *it->second));
  }
  return out;
}

std::vector<KernelDiff> diff_kernels(const std::vector<profiler::KernelStats>& a,
                                     const std::vector<profiler::KernelStats>& b) {
  std::map<std::string, KernelDiff> by_name;
  auto join = [&](const std::vector<profiler::KernelStats>& stats, bool is_b) {
    std::set<std::string> seen;
    for (const profiler::KernelStats& k : stats) {
      if (!seen.insert(k.name).second) {
        throw std::invalid_argument("diff_kernels: kernel '" + k.name + "' appears twice in run " + (is_b ? "B" : "A"));
      }
      KernelDiff& d = by_name[k.name];
      d.name = k.name;
      (is_b ? d.total_b_ns : d.total_a_ns) = k.total_ns;
      (is_b ? d.instances_b : d.instances_a) = k.instances;
      (is_b ? d.avg_b_ns : d.avg_a_ns) = k.avg_ns;
    }
  };
  join(a, false);
  join(b, true);
  std::vector<KernelDiff> out;
  for (auto& [name, d] : by_name) out.push_back(std::move(d));
  auto magnitude = [](const KernelDiff& d) {
    return d.total_a_ns > d.total_b_ns ? d.total_a_ns - d.total_b_ns : d.total_b_ns - d.total_a_ns;
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const KernelDiff& x, const KernelDiff& y) { return magnitude(x) > magnitude(y); });
  return out;
}

std::string comparison_table_text(const std::vector<CaseComparison>& comparisons) {
  return aligned_table(comparison_rows(comparisons, false), 3);
}

std::string comparison_table_markdown(const std::vector<CaseComparison>& comparisons) {
  return markdown_table(comparison_rows(comparisons, true), 3);
}

std::string kernel_diff_table_text(const std::vector<KernelDiff>& diffs, size_t top) {
  return aligned_table(kernel_diff_rows(diffs, top, false), 8) + more_kernels_line(diffs, top);
}

std::string kernel_diff_table_markdown(const std::vector<KernelDiff>& diffs, size_t top) {
  return markdown_table(kernel_diff_rows(diffs, top, true), 8) + more_kernels_line(diffs, top);
}

}  // namespace fusekit::reports
