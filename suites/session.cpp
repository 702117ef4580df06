#include "suites/session.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <utility>

#include "profiler/cupti_tracer.h"
#include "suites/demo.h"

namespace fusekit::suites {
namespace {

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " ") + p;
  return out;
}

// The steps before the run exists, in this order: a foreign file is refused before any GPU work,
// and NVTX injection is prepared before the first NVTX call.
store::Store open_store(const SessionOptions& options, const SessionSteps& steps) {
  if (access(options.db.c_str(), F_OK) == 0) (void)store::Store::open(options.db, store::Store::Mode::read_only);
  if (std::string reason = steps.gpu_unavailable_reason(); !reason.empty()) {
    throw std::runtime_error("no GPU: " + reason);
  }
  steps.prepare_nvtx_injection();
  return store::Store::open(options.db, store::Store::Mode::create);
}

}  // namespace

store::RunInfo describe_run(const std::string& label, const std::vector<std::string>& argv,
                            const profiler::Environment& env) {
  store::RunInfo info;
  info.label = label;
  // The program by its name, not the machine's path to it.
  std::vector<std::string> words = argv;
  if (!words.empty()) words[0] = words[0].substr(words[0].find_last_of('/') + 1);
  info.command_line = join(words);
  info.git_commit = env.git_commit;
  info.host = env.host;
  if (!env.gpus.empty()) {
    info.gpu_name = env.gpus.front().name;
    info.gpu_uuid = env.gpus.front().uuid;
  }
  info.driver_version = env.driver_version;
  info.cuda_version = env.runtime_version;
  info.libtorch_version = env.libtorch_version;
  return info;
}

int64_t begin_run(store::Store& store, const std::string& label, const std::vector<std::string>& argv,
                  const profiler::Environment& env) {
  const int64_t run = store.begin_run(describe_run(label, argv, env));
  try {
    for (const auto& g : env.gpus) store.add_gpu(run, g);
  } catch (...) {
    store.finish_run(run, "failed", 1);  // never leave a run marked running
    throw;
  }
  return run;
}

void check_dropped(uint64_t dropped, bool allowed) {
  if (dropped == 0) return;
  if (!allowed) {
    throw std::runtime_error(std::to_string(dropped) +
                             " trace records were dropped (the data kept is in the store); rerun, or pass "
                             "--allow-dropped to accept an incomplete trace");
  }
  std::fprintf(stderr, "fusekit: warning: %llu trace records were dropped\n", static_cast<unsigned long long>(dropped));
}

SessionSteps SessionSteps::on_device() {
  SessionSteps steps;
  steps.gpu_unavailable_reason = profiler::gpu_unavailable_reason;
  steps.prepare_nvtx_injection = profiler::prepare_nvtx_injection;
  steps.read_environment = profiler::read_environment;
  steps.measure_copy_ceiling = [] { return suites::measure_copy_ceiling(size_t{1} << 30, 20); };
  steps.run_cases = suites::run_cases;
  return steps;
}

Session::Session(SessionOptions options, SessionSteps steps)
    : options_(std::move(options)), steps_(std::move(steps)), store_(open_store(options_, steps_)) {
  run_ = begin_run(store_, options_.label, options_.argv, steps_.read_environment());
}

Session::~Session() {
  if (finished_) return;
  try {
    fail(1);
  } catch (const std::exception& e) {  // already unwinding: say so, but do not throw from here
    std::fprintf(stderr, "fusekit: run %lld could not be marked failed: %s\n", static_cast<long long>(run_), e.what());
  }
}

void Session::record_copy_ceiling() {
  const double ceiling = steps_.measure_copy_ceiling();
  store_.set_copy_ceiling(run_, ceiling);
  std::fprintf(stderr, "fusekit: device copy ceiling %.2f TB/s\n", ceiling / 1e12);
}

void Session::run_cases(const std::vector<Case>& cases, const RunnerOptions& options) {
  const uint64_t dropped = steps_.run_cases(store_, run_, cases, options);
  if (dropped > 0) {
    std::fprintf(stderr, "fusekit: %llu trace records of the traced repetitions were dropped\n",
                 static_cast<unsigned long long>(dropped));
  }
}

void Session::run_demo(const RunnerOptions& options) {
  DemoSuite demo;
  profiler::CuptiTracer& tracer = profiler::CuptiTracer::instance();
  tracer.start();
  demo.upload(nullptr);
  tracer.stop();
  store_.append_trace(run_, tracer.flush());
  run_cases(demo.cases(), options);
}

void Session::run_peers(const PeersOptions& peers) { suites::run_peers(store_, run_, options_.db, peers); }

int Session::finish() {
  // Every source of trace records counts: the runner, the demo's upload and the traced peers.
  check_dropped(store_.run(run_).dropped_records, options_.allow_dropped);
  store_.finish_run(run_, "ok", 0);
  finished_ = true;
  return 0;
}

void Session::interrupt(int exit_code) {
  finished_ = true;
  store_.finish_run(run_, "interrupted", exit_code);
}

void Session::fail(int exit_code) {
  finished_ = true;  // once: a failure to write the status is not retried by the destructor
  store_.finish_run(run_, "failed", exit_code);
}

}  // namespace fusekit::suites
