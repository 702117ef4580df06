#include "reports/case_groups.h"

#include <algorithm>

namespace fusekit::reports {
namespace {

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

int column_rank(const std::string& v) {
  if (v == "fused") return 0;
  if (starts_with(v, "fused:")) return 1;
  if (v == "baseline") return 2;
  if (starts_with(v, "baseline:")) return 3;
  if (v == "peer:eager") return 4;
  if (v == "peer:compile") return 5;
  if (starts_with(v, "peer:")) return 6;
  if (reference_variant(v)) return 8;
  return 7;
}

}  // namespace

bool fusekit_variant(const std::string& variant) { return variant == "fused" || starts_with(variant, "fused:"); }
bool reference_variant(const std::string& variant) { return starts_with(variant, "reference:"); }
bool other_implementation(const std::string& variant) {
  return !fusekit_variant(variant) && !reference_variant(variant);
}

std::vector<OperatorGroup> group_by_operator(const std::vector<CaseResult>& cases) {
  std::vector<OperatorGroup> groups;
  std::map<std::string, size_t> group_of;
  std::map<std::string, std::pair<size_t, size_t>> row_of;  // case name -> (group, row)
  for (const CaseResult& c : cases) {
    std::string op = c.info.op.empty() ? c.info.name.substr(0, c.info.name.find('/')) : c.info.op;
    auto g = group_of.find(op);
    if (g == group_of.end()) {
      g = group_of.emplace(op, groups.size()).first;
      groups.push_back({op, {}, {}});
    }
    OperatorGroup& group = groups[g->second];
    auto r = row_of.find(c.info.name);
    if (r == row_of.end()) {
      CaseRow row;
      row.name = c.info.name;
      row.label = starts_with(c.info.name, op + "/") ? c.info.name.substr(op.size() + 1) : c.info.name;
      r = row_of.emplace(c.info.name, std::make_pair(g->second, group.rows.size())).first;
      group.rows.push_back(std::move(row));
    }
    groups[r->second.first].rows[r->second.second].variants[c.info.variant] = &c;
    std::vector<std::string>& variants = groups[r->second.first].variants;
    if (std::find(variants.begin(), variants.end(), c.info.variant) == variants.end())
      variants.push_back(c.info.variant);
  }
  for (OperatorGroup& group : groups) {
    std::stable_sort(group.variants.begin(), group.variants.end(), [](const std::string& a, const std::string& b) {
      return column_rank(a) != column_rank(b) ? column_rank(a) < column_rank(b) : a < b;
    });
    for (CaseRow& row : group.rows) {
      const auto fused = row.variants.find("fused");
      if (fused == row.variants.end() || !(fused->second->median_ns > 0)) continue;
      row.fused = fused->second;
      const double fused_ns = row.fused->median_ns;
      const auto baseline = row.variants.find("baseline");
      if (baseline != row.variants.end() && baseline->second->median_ns > 0)
        row.vs_baseline = baseline->second->median_ns / fused_ns;
      for (const auto& [variant, c] : row.variants) {
        if (!other_implementation(variant) || !(c->median_ns > 0)) continue;
        if (!row.vs_best_other || c->median_ns / fused_ns < *row.vs_best_other) {
          row.best_other = variant;
          row.vs_best_other = c->median_ns / fused_ns;
        }
      }
    }
  }
  return groups;
}

}  // namespace fusekit::reports
