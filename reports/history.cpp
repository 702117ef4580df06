#include "reports/history.h"

#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <set>

namespace fusekit::reports {
namespace {

HistoryPoint point(const CaseResult& c) { return {c.median_ns, c.q1_ns, c.q3_ns}; }

// The file's canonical path (symbolic links and "..": resolved), or the path as given if it has none.
std::string canonical(const std::string& path) {
  std::unique_ptr<char, decltype(&free)> resolved(realpath(path.c_str(), nullptr), &free);
  return resolved ? std::string(resolved.get()) : path;
}

}  // namespace

History load_history(const std::vector<const store::Store*>& stores, const RunInfo& current,
                     const std::vector<CaseResult>& current_cases) {
  std::set<CaseKey> keys;
  for (const CaseResult& c : current_cases) keys.emplace(c.info.name, c.info.variant);
  History history;
  HistoryRun now;
  now.run = current;
  now.current = true;
  if (!stores.empty()) now.store = stores[0]->path();
  for (const CaseResult& c : current_cases) now.cases[{c.info.name, c.info.variant}] = point(c);
  std::set<std::string> seen;
  for (size_t i = 0; i < stores.size(); ++i) {
    const store::Store& s = *stores[i];
    if (!seen.insert(canonical(s.path())).second) continue;
    for (const RunInfo& info : s.runs()) {
      if ((i == 0 && info.id == current.id) || info.gpu_name != current.gpu_name) continue;
      HistoryRun run;
      run.store = s.path();
      run.run = info;
      for (const CaseResult& c : load_case_results(s, info.id)) {
        const CaseKey key{c.info.name, c.info.variant};
        if (keys.count(key) && c.median_ns > 0) run.cases[key] = point(c);
      }
      if (!run.cases.empty()) history.runs.push_back(std::move(run));
    }
  }
  history.runs.push_back(std::move(now));
  std::stable_sort(history.runs.begin(), history.runs.end(),
                   [](const HistoryRun& a, const HistoryRun& b) { return a.run.started_at < b.run.started_at; });
  return history;
}

}  // namespace fusekit::reports
