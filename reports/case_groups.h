// A run's cases grouped by operator (or model), one row per case with its variants side by side: what the
// HTML report's sections show.
//
// fusekit's variants are "fused" and "fused:<how>" (fused:no-master); "reference:<what>" variants are
// yardsticks (reference:copy, a copy of the same bytes), not competitors; every other variant (baseline,
// baseline:sdpa, peer:eager, peer:compile) is another implementation of the same computation. A speedup
// is the other variant's median over fused's median: above 1, fused is faster.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reports/run_report.h"

namespace fusekit::reports {

struct CaseRow {
  std::string name;   // the case's name
  std::string label;  // the name without its "<op>/" prefix
  std::map<std::string, const CaseResult*> variants;
  const CaseResult* fused = nullptr;    // the "fused" variant, if the case has one
  std::optional<double> vs_baseline;    // baseline median / fused median
  std::string best_other;               // the fastest other implementation (not fused*, not reference:*)
  std::optional<double> vs_best_other;  // its median / fused median
};

struct OperatorGroup {
  std::string op;
  std::vector<std::string> variants;  // the columns: fused, fused:*, baseline, baseline:*, peer:eager,
                                      // peer:compile, other peer:*, others, reference:*
  std::vector<CaseRow> rows;          // in the run's order
};

bool fusekit_variant(const std::string& variant);    // fused, fused:<how>
bool reference_variant(const std::string& variant);  // reference:<what>
// Neither fusekit's nor a reference: another implementation fused is compared against.
bool other_implementation(const std::string& variant);

// The cases by operator (CaseInfo::op; where empty, the name up to its first '/'), operators in the order
// of their first case. The cases must outlive the groups.
std::vector<OperatorGroup> group_by_operator(const std::vector<CaseResult>& cases);

}  // namespace fusekit::reports
