// The history of a run's cases: their medians in the other runs of one store or of several, for the HTML
// report's charts of each case's median over commits.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "reports/run_report.h"
#include "store/store.h"

namespace fusekit::reports {

struct HistoryPoint {
  double median_ns = 0;
  double q1_ns = 0;
  double q3_ns = 0;
};

struct HistoryRun {
  std::string store;  // the path of the store that holds it
  RunInfo run;
  bool current = false;                   // the run the report shows
  std::map<CaseKey, HistoryPoint> cases;  // only the cases (name and variant) the current run has too
};

// Oldest first (by start time).
struct History {
  std::vector<HistoryRun> runs;
};

// The runs of `stores` that ran on the current run's GPU (by name) and share a case (name and variant) with
// it, the current run included, oldest first (runs that started in the same second: in the order of the
// stores and their ids, the current run last). stores[0] is the store that holds the current run (a run
// with its id there is the current one); a store given twice (the same file, by its canonical path)
// counts once. `current_cases` are the current run's cases.
History load_history(const std::vector<const store::Store*>& stores, const RunInfo& current,
                     const std::vector<CaseResult>& current_cases);

}  // namespace fusekit::reports
