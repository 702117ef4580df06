#include "reports/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "reports/terminal.h"

namespace fusekit::reports {
namespace {

using CaseKey = std::pair<std::string, std::string>;  // (name, variant)

std::string describe(const CaseKey& key) { return key.first + " [" + key.second + "]"; }

double case_median_ns(const CaseResult& c) {
  return c.samples_ns.empty() ? c.median_ns : profiler::median(c.samples_ns);
}

std::map<CaseKey, const CaseResult*> index_cases(const std::vector<CaseResult>& cases, const char* which) {
  std::map<CaseKey, const CaseResult*> index;
  for (const CaseResult& c : cases) {
    CaseKey key{c.info.name, c.info.variant};
    if (!index.emplace(key, &c).second) {
      throw std::invalid_argument(std::string("duplicate case in ") + which + ": " + describe(key));
    }
  }
  return index;
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

std::string format_microseconds(double ns) {
  if (std::isnan(ns)) return "-";
  const double us = ns / 1e3;
  const double magnitude = std::fabs(us);
  return format_fixed(us, magnitude < 10 ? 3 : magnitude < 1000 ? 2 : 1);
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

std::string markdown_code(const std::string& text) {
  if (text.empty()) return "";
  size_t longest_run = 0;
  for (size_t i = 0, run = 0; i < text.size(); ++i) {
    run = text[i] == '`' ? run + 1 : 0;
    longest_run = std::max(longest_run, run);
  }
  std::string escaped;
  for (char ch : text) escaped += ch == '|' ? std::string("\\|") : std::string(1, ch);
  const std::string fence(longest_run + 1, '`');
  // A code span strips one space from each end, which lets it begin or end with a backtick.
  const std::string pad = longest_run > 0 ? " " : "";
  return fence + pad + escaped + pad + fence;
}

}  // namespace fusekit::reports
