// The store: round trip, schema versions, foreign, corrupt, truncated and missing files.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "reports/run_report.h"
#include "store/store.h"

namespace fusekit::store {
namespace {

namespace fs = std::filesystem;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fusekit_store_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void sql(const std::string& path, const char* statement) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  ASSERT_EQ(sqlite3_exec(db, statement, nullptr, nullptr, &error), SQLITE_OK) << (error ? error : "");
  sqlite3_close(db);
}

profiler::Trace sample_trace(std::mt19937& rng, int kernels) {
  profiler::Trace t;
  t.process_id = 4242;
  std::uniform_int_distribution<uint64_t> gap(1, 1000);
  uint64_t now = 1'000'000;
  for (int i = 0; i < kernels; ++i) {
    profiler::ApiRecord a;
    a.start = now;
    a.end = now + 5;
    a.process_id = 4242;
    a.thread_id = 17 + (i % 2);
    a.correlation_id = static_cast<uint32_t>(i + 1);
    a.callback_id = 211;
    a.name = "cudaLaunchKernel";
    a.kind = i % 3 == 0 ? profiler::ApiKind::driver : profiler::ApiKind::runtime;
    t.api_calls.push_back(a);
    profiler::KernelRecord k;
    k.start = now + gap(rng);
    k.end = k.start + gap(rng);
    k.device_id = 0;
    k.context_id = 1;
    k.stream_id = 7 + (i % 3);
    k.correlation_id = a.correlation_id;
    k.process_id = a.process_id;
    k.name = i % 2 ? "void gemm<float, 128>(float const*, float*)" : "relu_kernel";
    k.grid_x = i + 1;
    k.grid_y = 2;
    k.grid_z = 1;
    k.block_x = 256;
    k.block_y = 1;
    k.block_z = 1;
    k.registers_per_thread = 32;
    k.static_shared_memory = 1024;
    k.dynamic_shared_memory = 4096 * i;
    t.kernels.push_back(k);
    now += 2000;
  }
  t.memcpys.push_back({now, now + 100, 0, 1, 7, 9999, 4242, 1 << 20, 1, 1, 3});
  t.memsets.push_back({now + 200, now + 250, 0, 1, 8, 9998, 4242, 4096, 255});
  profiler::RangeRecord r;
  r.start = 999'000;
  r.end = now + 300;
  r.process_id = 4242;
  r.thread_id = 17;
  r.end_thread_id = 17;
  r.text = "step, with \"quotes\"";
  t.ranges.push_back(r);
  r.end = 0;  // never closed
  r.text = "open";
  r.event_type = profiler::kNvtxStartEndRange;
  r.domain = "fusekit";
  t.ranges.push_back(r);
  return t;
}

TEST_F(StoreTest, RoundTripKeepsEveryField) {
  std::mt19937 rng(1234);
  const profiler::Trace trace = sample_trace(rng, 50);
  const std::string db = path("a.db");
  int64_t run = 0;
  {
    Store store = Store::open(db, Store::Mode::create);
    RunInfo info;
    info.label = "round trip";
    info.command_line = "fusekit bench --db a.db";
    info.git_commit = std::string(40, 'a');
    info.gpu_name = "Test GPU";
    run = store.begin_run(info);
    profiler::GpuInfo gpu;
    gpu.name = "Test GPU";
    gpu.sm_count = 132;
    gpu.compute_major = 9;
    store.add_gpu(run, gpu);
    store.append_trace(run, trace);
    profiler::Trace dropped;
    dropped.dropped_records = 3;
    store.append_trace(run, dropped);
    CaseInfo c{"demo/x/fp32", "x", "1024", "fp32", "baseline", 8192, 2048};
    store.add_case(run, c, {100, 300, 200, 400});
    c.variant = "fused";
    store.add_case(run, c, {50, 60, 40, 70, 1000});
    store.set_copy_ceiling(run, 1e12);
    store.finish_run(run, "ok", 0);
  }
  Store store = Store::open(db, Store::Mode::read_only);
  ASSERT_EQ(store.latest_run(), run);
  const RunInfo info = store.run(run);
  EXPECT_EQ(info.label, "round trip");
  EXPECT_EQ(info.status, "ok");
  EXPECT_EQ(info.dropped_records, 3u);
  EXPECT_FALSE(info.finished_at.empty());
  ASSERT_EQ(store.gpus(run).size(), 1u);
  EXPECT_EQ(store.gpus(run)[0].sm_count, 132);

  const profiler::Trace back = store.load_trace(run);
  ASSERT_EQ(back.kernels.size(), trace.kernels.size());
  for (size_t i = 0; i < trace.kernels.size(); ++i) {  // both ordered by start
    const auto& a = trace.kernels[i];
    const auto& b = back.kernels[i];
    EXPECT_EQ(a.start, b.start);
    EXPECT_EQ(a.end, b.end);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.stream_id, b.stream_id);
    EXPECT_EQ(a.correlation_id, b.correlation_id);
    EXPECT_EQ(a.grid_x, b.grid_x);
    EXPECT_EQ(a.dynamic_shared_memory, b.dynamic_shared_memory);
    EXPECT_EQ(a.registers_per_thread, b.registers_per_thread);
  }
  ASSERT_EQ(back.api_calls.size(), trace.api_calls.size());
  EXPECT_EQ(back.api_calls[0].kind, profiler::ApiKind::driver);
  EXPECT_EQ(back.api_calls[1].kind, profiler::ApiKind::runtime);
  EXPECT_EQ(back.api_calls[1].thread_id, 18u);
  EXPECT_EQ(back.api_calls[1].process_id, 4242u);
  ASSERT_EQ(back.memcpys.size(), 1u);
  EXPECT_EQ(back.memcpys[0].bytes, 1u << 20);
  ASSERT_EQ(back.memsets.size(), 1u);
  EXPECT_EQ(back.memsets[0].value, 255u);
  ASSERT_EQ(back.ranges.size(), 2u);
  EXPECT_EQ(back.ranges[0].text, "step, with \"quotes\"");
  EXPECT_EQ(back.ranges[1].end, 0u);
  EXPECT_EQ(back.ranges[1].event_type, profiler::kNvtxStartEndRange);
  EXPECT_EQ(back.ranges[1].domain, "fusekit");

  const auto stored = store.load_cases(run);  // raw: in the order added, samples in order
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_EQ(stored[0].info.variant, "baseline");
  EXPECT_EQ(stored[0].samples_ns, (std::vector<double>{100, 300, 200, 400}));
  EXPECT_EQ(stored[1].info.name, "demo/x/fp32");
  EXPECT_DOUBLE_EQ(stored[1].info.bytes, 8192);

  // The derived statistics, computed by reports/ from the stored samples and the run's copy ceiling.
  const auto cases = reports::load_case_results(store, run);
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_DOUBLE_EQ(cases[0].median_ns, 250.0);
  EXPECT_DOUBLE_EQ(cases[1].median_ns, 60.0);
  ASSERT_TRUE(cases[1].speedup.has_value());
  EXPECT_DOUBLE_EQ(*cases[1].speedup, 250.0 / 60.0);
  ASSERT_TRUE(cases[1].bandwidth_percent.has_value());
  EXPECT_NEAR(*cases[1].bandwidth_percent, 100.0 * 8192 / 60e-9 / 1e12, 1e-9);

  const reports::RunReport report = reports::load_run_report(store, run);
  EXPECT_EQ(report.run.label, "round trip");
  EXPECT_EQ(report.cases.size(), 2u);
  EXPECT_EQ(report.totals.kernels, 50u);
  ASSERT_EQ(report.kernels.size(), 2u);
  EXPECT_EQ(report.kernels[0].instances + report.kernels[1].instances, 50u);
}

// Case metrics: stored with their case, read back in order; a store made before the table existed
// reads without metrics and gets the table on its first metric; a bad metric is refused.
TEST_F(StoreTest, CaseMetricsRoundTripAndOlderStoresReadWithout) {
  const std::string db = path("metrics.db");
  {
    Store store = Store::open(db, Store::Mode::create);
    const int64_t run = store.begin_run({});
    CaseInfo c{"m/x/fp16", "m", "x", "fp16", "fused", 0, 1e12};
    store.add_case(run, c, {10, 20}, {{"peak_memory_bytes", 3e9}, {"steps", 4}});
    EXPECT_THROW(store.add_case(run, c, {10}, {{"peak_memory_bytes", NAN}}), StoreError);
    EXPECT_THROW(store.add_case(run, c, {10}, {{"", 1}}), StoreError);
    const std::vector<StoredCase> cases = store.load_cases(run);
    ASSERT_EQ(cases.size(), 1u);  // the refused ones left nothing
    ASSERT_EQ(cases[0].metrics.size(), 2u);
    EXPECT_EQ(cases[0].metrics[0].name, "peak_memory_bytes");
    EXPECT_EQ(cases[0].metrics[0].value, 3e9);
    EXPECT_EQ(cases[0].metrics[1].name, "steps");
  }
  {  // as a store written before case_metrics existed
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "DROP TABLE case_metrics", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(raw);
  }
  Store store = Store::open(db, Store::Mode::read_write);
  const int64_t run = store.latest_run();
  EXPECT_TRUE(store.load_cases(run).at(0).metrics.empty());
  store.add_case(run, {"m/y/fp16", "m", "y", "fp16", "fused", 0, 0}, {5}, {{"peak_memory_bytes", 1}});
  EXPECT_EQ(store.load_cases(run).at(1).metrics.at(0).value, 1);
}

TEST_F(StoreTest, NsysStyleJoinRunsUnchanged) {
  std::mt19937 rng(7);
  const std::string db = path("nsys.db");
  {
    Store store = Store::open(db, Store::Mode::create);
    const int64_t run = store.begin_run({});
    store.append_trace(run, sample_trace(rng, 10));
  }
  // The query a user would write for an nsys export.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw,
                               "SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
                               "JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON k.correlationId = r.correlationId "
                               "JOIN StringIds AS s ON s.id = k.shortName WHERE s.value = 'gemm'",
                               -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(stmt, 0), 5);
  sqlite3_finalize(stmt);
  sqlite3_close(raw);
}

TEST_F(StoreTest, RunsListsEveryRunById) {
  Store s = Store::open(path("runs.db"), Store::Mode::create);
  EXPECT_TRUE(s.runs().empty());
  RunInfo a;
  a.git_commit = "aaaa";
  RunInfo b;
  b.git_commit = "bbbb";
  b.started_at = "2026-01-02T00:00:00Z";
  const int64_t first = s.begin_run(a);
  const int64_t second = s.begin_run(b);
  const std::vector<RunInfo> runs = s.runs();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].id, first);
  EXPECT_EQ(runs[0].git_commit, "aaaa");
  EXPECT_EQ(runs[1].id, second);
  EXPECT_EQ(runs[1].started_at, "2026-01-02T00:00:00Z");
  EXPECT_EQ(runs[1].status, "running");
}

TEST_F(StoreTest, MissingFileIsAnErrorUnlessCreating) {
  EXPECT_THROW(Store::open(path("missing.db"), Store::Mode::read_only), StoreError);
  EXPECT_THROW(Store::open(path("missing.db"), Store::Mode::read_write), StoreError);
  EXPECT_FALSE(fs::exists(path("missing.db")));
  try {
    Store::open(path("missing.db"), Store::Mode::read_only);
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Store::open(path("new.db"), Store::Mode::create));
  EXPECT_TRUE(fs::exists(path("new.db")));
}

TEST_F(StoreTest, ForeignSqliteFileIsRefusedAndLeftUnchanged) {
  const std::string db = path("foreign.db");
  sql(db, "CREATE TABLE people(name TEXT); INSERT INTO people VALUES ('x');");
  const std::string before = read_file(db);
  for (auto mode : {Store::Mode::read_only, Store::Mode::read_write, Store::Mode::create}) {
    try {
      Store::open(db, mode);
      ADD_FAILURE() << "a foreign SQLite file was accepted";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("not a fusekit store"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(read_file(db), before);
  EXPECT_FALSE(fs::exists(db + "-wal"));
}

TEST_F(StoreTest, OtherSchemaVersionIsRefused) {
  const std::string db = path("v99.db");
  { Store::open(db, Store::Mode::create); }
  sql(db, "UPDATE meta SET value = '99' WHERE key = 'schema_version'");
  try {
    Store::open(db, Store::Mode::read_only);
    ADD_FAILURE() << "schema version 99 was accepted";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("schema version 99"), std::string::npos) << e.what();
  }
}

TEST_F(StoreTest, GarbageAndTruncatedFilesAreCorrupt) {
  const std::string garbage = path("garbage.db");
  {
    std::ofstream out(garbage, std::ios::binary);
    out << "this is not a database at all, just text\n";
  }
  EXPECT_THROW(Store::open(garbage, Store::Mode::read_only), StoreError);
  EXPECT_THROW(Store::open(garbage, Store::Mode::create), StoreError);

  const std::string db = path("big.db");
  {
    std::mt19937 rng(3);
    Store store = Store::open(db, Store::Mode::create);
    const int64_t run = store.begin_run({});
    store.append_trace(run, sample_trace(rng, 3000));
  }
  sql(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  const auto size = fs::file_size(db);
  ASSERT_GT(size, 100'000u);
  fs::resize_file(db, size / 2);
  EXPECT_THROW(
      {
        Store store = Store::open(db, Store::Mode::read_only);
        store.load_trace(store.latest_run());
      },
      StoreError);
}

TEST_F(StoreTest, EmptyFileIsNotAStoreButCanBecomeOne) {
  const std::string db = path("empty.db");
  { std::ofstream out(db); }
  EXPECT_THROW(Store::open(db, Store::Mode::read_only), StoreError);
  Store store = Store::open(db, Store::Mode::create);
  EXPECT_THROW(store.latest_run(), StoreError);
  EXPECT_THROW(store.run(5), StoreError);
}

TEST_F(StoreTest, EveryCommittedAppendSurvivesAKilledWriter) {
  const std::string db = path("killed.db");
  { Store::open(db, Store::Mode::create); }
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Store store = Store::open(db, Store::Mode::read_write);
    const int64_t run = store.begin_run({});
    std::mt19937 rng(5);
    for (int i = 0; i < 3; ++i) store.append_trace(run, sample_trace(rng, 100));
    _exit(0);  // the next statement of a real writer is never reached: no close, no checkpoint
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  Store store = Store::open(db, Store::Mode::read_only);
  EXPECT_EQ(store.load_trace(store.latest_run()).kernels.size(), 300u);
  EXPECT_EQ(store.run(store.latest_run()).status, "running");
}

}  // namespace
}  // namespace fusekit::store
