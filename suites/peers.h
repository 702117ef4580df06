// The peers' protocol: how a peers script (scripts/peers/ops.py) learns the cases to time and
// hands its samples back, so that the C++ registry (suites/ops/ops_suite.h) is the one place that
// knows cases, shapes and bytes, and the store has one writer.
//
//   listing  (fusekit -> peer): a JSON array, one object per line and case, in suite order:
//            {"name": "layernorm/8192x768/fp16/fwd", "op": "layernorm", "shape": "8192x768",
//             "dtype": "fp16", "direction": "fwd", "bytes": 25169920, "flops": 0}
//            direction is "fwd" or "fwd+bwd"; bytes must move (each input read once, each output
//            written once); flops are 0 where not counted.
//   results  (peer -> fusekit): one JSON object per line, a case and a variant each:
//            {"name": "layernorm/8192x768/fp16/fwd", "variant": "peer:eager", "samples_ns": [...]}
//            name one of the listed cases; variant "peer:<something>"; samples_ns every timed
//            sample, in order, each finite and positive; optionally "metrics": {"<name>": number,
//            ...}, stored with the case (store::CaseMetric: "peak_memory_bytes"), each finite and
//            named once. Blank lines are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"
#include "suites/ops/ops_suite.h"

namespace fusekit::suites {

// The listing of `cases`, as above.
std::string case_listing_json(const std::vector<ListedCase>& cases);

struct PeerResult {
  std::string name;
  std::string variant;
  std::vector<double> samples_ns;
  std::vector<store::CaseMetric> metrics;
};

// The results in `text`, every line checked against `cases` before any is returned. A bad line
// throws std::runtime_error "<source> line N: <what is wrong>" (N counts from 1).
std::vector<PeerResult> parse_peer_results(const std::string& text, const std::vector<ListedCase>& cases,
                                           const std::string& source);

// Writes each result into `run` of `store` as a case: the listed case's description with the
// result's variant, and its samples.
void record_peer_results(store::Store& store, int64_t run, const std::vector<PeerResult>& results,
                         const std::vector<ListedCase>& cases);

// The two files a peers script is given: the listing, written on construction into a new temporary
// folder, and the path it writes its results to. The folder is removed on destruction.
class PeerFiles {
 public:
  explicit PeerFiles(const std::vector<ListedCase>& cases);
  PeerFiles(const PeerFiles&) = delete;
  PeerFiles& operator=(const PeerFiles&) = delete;
  ~PeerFiles();
  const std::string& cases_path() const { return cases_path_; }
  const std::string& results_path() const { return results_path_; }
  // Reads, checks and records the results file (as parse_peer_results, record_peer_results);
  // returns the number of results recorded. After the script failed (`script_failed`), what it
  // handed back before failing is recorded too, as the run's own cases are; a missing or bad file
  // then records nothing and is a warning on stderr, so that the script's failure is the error.
  size_t record_results(store::Store& store, int64_t run, bool script_failed = false) const;

 private:
  std::vector<ListedCase> cases_;
  std::string folder_, cases_path_, results_path_;
};

struct PeersOptions {
  std::string script;  // the peers script; empty: no peers
  int repetitions = 50;
  int warmup = 10;
  double warmup_ms = 25;
  double sample_us = 500;
  OpsRequest cases;  // the cases the session ran, listed for the script
};

// Runs the peers script on the listed cases: timed untraced, its samples handed back and recorded
// into `run` of `store` (the store at `db`), then traced (--traced-only) for the kernel shares into
// the same run. Throws if the script fails; what it handed back before failing stays recorded.
void run_peers(store::Store& store, int64_t run, const std::string& db, const PeersOptions& options);

}  // namespace fusekit::suites
