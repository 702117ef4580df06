// One `fusekit bench` run from start to finish.
//
// Opening a session refuses a file that is not a fusekit store before any GPU work, checks the GPU,
// prepares NVTX injection, opens (or creates) the store, records the environment and GPUs and begins
// the run. Then the copy ceiling, the cases and the peers are recorded into that run, and finish()
// checks the dropped trace records and marks the run ok. A run that is not finished (an exception
// escaped) is marked failed, exit code 1, when the session ends: no run stays "running".
//
// The steps that need a GPU are SessionSteps, so that the session's bookkeeping tests without one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "profiler/environment.h"
#include "store/run_records.h"
#include "store/store.h"
#include "suites/peers.h"
#include "suites/runner.h"

namespace fusekit::suites {

struct SessionOptions {
  std::string db;                 // the store, created if missing
  std::string label;              // stored with the run
  std::vector<std::string> argv;  // the command line, stored with the run
  bool allow_dropped = false;     // accept a trace with dropped records (a warning instead of an error)
};

// The GPU-facing steps of a session; on_device() gives the real ones.
struct SessionSteps {
  std::function<std::string()> gpu_unavailable_reason;  // "" if a GPU is usable
  std::function<void()> prepare_nvtx_injection;
  std::function<profiler::Environment()> read_environment;
  std::function<double()> measure_copy_ceiling;  // bytes per second
  std::function<uint64_t(store::Store&, int64_t, const std::vector<Case>&, const RunnerOptions&)> run_cases;
  static SessionSteps on_device();
};

class Session {
 public:
  // Throws store::StoreError for a foreign or damaged file, std::runtime_error without a GPU.
  explicit Session(SessionOptions options, SessionSteps steps = SessionSteps::on_device());
  ~Session();  // an unfinished run is marked failed, exit code 1
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  store::Store& store() { return store_; }
  int64_t run() const { return run_; }
  const std::string& db() const { return options_.db; }

  // Measures the device copy ceiling and records it with the run.
  void record_copy_ceiling();
  // Times and traces the cases into the run (the runner); reports the trace records it dropped.
  void run_cases(const std::vector<Case>& cases, const RunnerOptions& options);
  // The built-in demo: its upload traced, then its cases.
  void run_demo(const RunnerOptions& options);
  // The peers script into the same run; throws if it fails.
  void run_peers(const PeersOptions& peers);

  // Checks the run's dropped trace records (an error unless allowed), then marks the run ok.
  // Returns the exit code, 0.
  int finish();
  // Marks the run failed with `exit_code`; what the run recorded stays.
  void fail(int exit_code);
  // Marks the run interrupted (a SIGINT or SIGTERM, suites/interrupt.h) with `exit_code`; what the
  // run recorded stays.
  void interrupt(int exit_code);

 private:
  SessionOptions options_;
  SessionSteps steps_;
  store::Store store_;
  int64_t run_ = 0;
  bool finished_ = false;
};

// The run's description: label, command line (the program by its name, not its path), commit,
// host, first GPU, versions.
store::RunInfo describe_run(const std::string& label, const std::vector<std::string>& argv,
                            const profiler::Environment& env);
// Begins a run in `store` described by `label`, `argv` and `env`, with its GPUs. Returns its id.
int64_t begin_run(store::Store& store, const std::string& label, const std::vector<std::string>& argv,
                  const profiler::Environment& env);
// Nothing if `dropped` is 0; a warning on stderr if `allowed`; otherwise throws std::runtime_error.
void check_dropped(uint64_t dropped, bool allowed);

}  // namespace fusekit::suites
