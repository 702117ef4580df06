// The session's bookkeeping without a GPU (suites/session.h): its GPU steps are replaced by fakes, so
// the order of its checks, the run's status and exit code on every path and the dropped-record check
// are tested on any machine.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>

#include "posix_files.h"
#include "store/store.h"
#include "suites/interrupt.h"
#include "suites/session.h"

namespace fusekit::suites {
namespace {

using test_support::path_exists;
using test_support::TempDir;

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("fusekit_session_test_");
    db_ = dir_->file("run.db");
  }
  void TearDown() override { dir_.reset(); }

  // Steps that succeed without a GPU; `calls` counts those that ran.
  SessionSteps fake_steps() {
    SessionSteps steps;
    steps.gpu_unavailable_reason = [this] {
      ++calls_;
      return std::string();
    };
    steps.prepare_nvtx_injection = [this] { ++calls_; };
    steps.read_environment = [] {
      profiler::Environment env;
      env.host = "test-host";
      profiler::GpuInfo gpu;
      gpu.name = "Test GPU";
      env.gpus.push_back(gpu);
      return env;
    };
    steps.measure_copy_ceiling = [] { return 3e12; };
    steps.run_cases = [](store::Store& store, int64_t run, const std::vector<Case>&, const RunnerOptions&) {
      store.add_case(run, {"demo/x/1024/fp32", "x", "1024", "fp32", "fused", 8192, 0}, {10, 11, 12});
      return uint64_t{0};
    };
    return steps;
  }

  SessionOptions options(bool allow_dropped = false) {
    return {db_, "label", {"/a/path/to/fusekit", "bench", "--db", "run.db"}, allow_dropped};
  }

  store::RunInfo stored_run() {
    store::Store store = store::Store::open(db_, store::Store::Mode::read_only);
    return store.run(store.latest_run());
  }

  std::unique_ptr<TempDir> dir_;
  std::string db_;
  int calls_ = 0;
};

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(SessionTest, RefusesAForeignFileBeforeAnyGpuWork) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  const std::string before = contents(db_);
  try {
    Session session(options(), fake_steps());
    FAIL() << "a foreign file was opened";
  } catch (const store::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("not a fusekit store"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls_, 0);  // neither the GPU check nor NVTX
  EXPECT_EQ(contents(db_), before);
}

TEST_F(SessionTest, NoGpuIsOneClearErrorAndNoStore) {
  SessionSteps steps = fake_steps();
  steps.gpu_unavailable_reason = [] { return std::string("no CUDA-capable device is detected"); };
  try {
    Session session(options(), steps);
    FAIL() << "a session began without a GPU";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "no GPU: no CUDA-capable device is detected");
  }
  EXPECT_FALSE(path_exists(db_));
}

TEST_F(SessionTest, FinishedRunIsOkWithWhatItRecorded) {
  {
    Session session(options(), fake_steps());
    EXPECT_EQ(calls_, 2);
    session.record_copy_ceiling();
    session.run_cases({}, {});
    EXPECT_EQ(session.finish(), 0);
  }
  const store::RunInfo run = stored_run();
  EXPECT_EQ(run.status, "ok");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_FALSE(run.finished_at.empty());
  EXPECT_EQ(run.label, "label");
  EXPECT_EQ(run.command_line, "fusekit bench --db run.db");  // the program by its name, not its path
  EXPECT_EQ(run.host, "test-host");
  EXPECT_EQ(run.gpu_name, "Test GPU");
  EXPECT_DOUBLE_EQ(run.copy_ceiling_bytes_per_second, 3e12);
  store::Store store = store::Store::open(db_, store::Store::Mode::read_only);
  EXPECT_EQ(store.gpus(run.id).size(), 1u);
  ASSERT_EQ(store.load_cases(run.id).size(), 1u);
  EXPECT_EQ(store.load_cases(run.id)[0].samples_ns.size(), 3u);
}

TEST_F(SessionTest, ACaseThatThrowsLeavesTheRunFailedWithItsRecords) {
  SessionSteps steps = fake_steps();
  auto record_one = steps.run_cases;
  steps.run_cases = [record_one](store::Store& store, int64_t run, const std::vector<Case>& cases,
                                 const RunnerOptions& options) -> uint64_t {
    record_one(store, run, cases, options);
    throw std::runtime_error("CUDA error: an illegal memory access was encountered");
  };
  try {
    Session session(options(), steps);
    session.record_copy_ceiling();
    session.run_cases({}, {});
    FAIL() << "the case's error was swallowed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos);
  }
  const store::RunInfo run = stored_run();
  EXPECT_EQ(run.status, "failed");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_FALSE(run.finished_at.empty());
  store::Store store = store::Store::open(db_, store::Store::Mode::read_only);
  EXPECT_EQ(store.load_cases(run.id).size(), 1u);  // what the run recorded stays
}

// A SIGTERM between cases (suites/interrupt.h): what `fusekit bench` does with the Interrupted the
// runner throws. The run ends "interrupted" with 128 + 15, and the case recorded before stays.
TEST_F(SessionTest, AnInterruptedRunKeepsWhatItRecorded) {
  SessionSteps steps = fake_steps();
  const auto record_one = steps.run_cases;
  steps.run_cases = [record_one](store::Store& store, int64_t run, const std::vector<Case>& cases,
                                 const RunnerOptions& options) -> uint64_t {
    record_one(store, run, cases, options);
    throw Interrupted(SIGTERM);
  };
  {
    Session session(options(), steps);
    try {
      session.run_cases({}, {});
      FAIL() << "the interruption was swallowed";
    } catch (const Interrupted& e) {
      EXPECT_EQ(e.exit_code(), 128 + SIGTERM);
      session.interrupt(e.exit_code());
    }
  }  // the destructor leaves an interrupted run as it is
  const store::RunInfo run = stored_run();
  EXPECT_EQ(run.status, "interrupted");
  EXPECT_EQ(run.exit_code, 128 + SIGTERM);
  store::Store store = store::Store::open(db_, store::Store::Mode::read_only);
  EXPECT_EQ(store.load_cases(run.id).size(), 1u);
}

// The runner's traced repetitions drop 4 records: the run fails unless dropped records are allowed.
SessionSteps dropping_steps(SessionSteps steps) {
  steps.run_cases = [](store::Store& store, int64_t run, const std::vector<Case>&, const RunnerOptions&) {
    profiler::Trace trace;
    trace.dropped_records = 4;
    store.append_trace(run, trace);
    return uint64_t{4};
  };
  return steps;
}

TEST_F(SessionTest, DroppedRecordsFailTheRun) {
  try {
    Session session(options(), dropping_steps(fake_steps()));
    session.run_cases({}, {});
    session.finish();
    FAIL() << "dropped records were accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("4 trace records were dropped"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--allow-dropped"), std::string::npos) << e.what();
  }
  const store::RunInfo run = stored_run();
  EXPECT_EQ(run.status, "failed");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.dropped_records, 4u);
}

TEST_F(SessionTest, DroppedRecordsAllowedFinishOk) {
  {
    Session session(options(/*allow_dropped=*/true), dropping_steps(fake_steps()));
    session.run_cases({}, {});
    EXPECT_EQ(session.finish(), 0);
  }
  EXPECT_EQ(stored_run().status, "ok");
}

TEST_F(SessionTest, AnExistingStoreGetsANewRun) {
  for (int i = 0; i < 2; ++i) {
    Session session(options(), fake_steps());
    EXPECT_EQ(session.run(), i + 1);
    session.finish();
  }
  EXPECT_EQ(stored_run().id, 2);
}

}  // namespace
}  // namespace fusekit::suites
