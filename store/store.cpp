#include "store/store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <unordered_map>
#include <utility>

namespace fusekit::store {
namespace {

// The one checking macro for SQLite: file, line, the call, SQLite's message, the store's path.
#define FUSEKIT_SQLITE_CHECK(db, path, call)                                                                  \
  do {                                                                                                        \
    int fusekit_rc_ = (call);                                                                                 \
    if (fusekit_rc_ != SQLITE_OK && fusekit_rc_ != SQLITE_DONE && fusekit_rc_ != SQLITE_ROW) {                \
      throw StoreError(std::string(path) + ": " + ((db) ? sqlite3_errmsg(db) : sqlite3_errstr(fusekit_rc_)) + \
                       " (" #call " at " __FILE__ ":" + std::to_string(__LINE__) + ")");                      \
    }                                                                                                         \
  } while (0)

constexpr const char* kSchema = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs(
  id INTEGER PRIMARY KEY, startedAt TEXT NOT NULL, finishedAt TEXT, label TEXT, commandLine TEXT,
  gitCommit TEXT, host TEXT, gpuName TEXT, gpuUuid TEXT, driverVersion TEXT, cudaVersion TEXT,
  libtorchVersion TEXT, status TEXT NOT NULL, exitCode INTEGER, droppedRecords INTEGER NOT NULL DEFAULT 0,
  copyCeilingBytesPerSecond REAL);
CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE);
CREATE TABLE TARGET_INFO_GPU(
  runId INTEGER NOT NULL REFERENCES runs(id), id INTEGER NOT NULL, name TEXT, uuid TEXT, busLocation TEXT,
  totalMemory INTEGER, smCount INTEGER, computeMajor INTEGER, computeMinor INTEGER, l2CacheSize INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(
  runId INTEGER NOT NULL REFERENCES runs(id), start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER REFERENCES StringIds(id), shortName INTEGER REFERENCES StringIds(id),
  gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
  registersPerThread INTEGER, staticSharedMemory INTEGER, dynamicSharedMemory INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY(
  runId INTEGER NOT NULL REFERENCES runs(id), start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER, copyKind INTEGER, srcKind INTEGER, dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET(
  runId INTEGER NOT NULL REFERENCES runs(id), start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER, value INTEGER);
-- eventClass: 1 runtime API, 2 driver API (fusekit's values).
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME(
  runId INTEGER NOT NULL REFERENCES runs(id), start INTEGER NOT NULL, end INTEGER NOT NULL,
  eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER REFERENCES StringIds(id),
  returnValue INTEGER, callbackId INTEGER);
-- eventType: 59 push/pop range, 60 start/end range, as nsys writes them; end NULL if never closed.
CREATE TABLE NVTX_EVENTS(
  runId INTEGER NOT NULL REFERENCES runs(id), start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
  text TEXT, textId INTEGER, globalTid INTEGER, endGlobalTid INTEGER, domain TEXT);
CREATE TABLE cases(
  id INTEGER PRIMARY KEY, runId INTEGER NOT NULL REFERENCES runs(id), name TEXT NOT NULL, op TEXT,
  shape TEXT, dtype TEXT, variant TEXT NOT NULL, bytes REAL, flops REAL);
CREATE TABLE samples(caseId INTEGER NOT NULL REFERENCES cases(id), rep INTEGER NOT NULL, nanoseconds REAL NOT NULL);
CREATE TABLE case_metrics(caseId INTEGER NOT NULL REFERENCES cases(id), name TEXT NOT NULL, value REAL NOT NULL);
CREATE INDEX kernel_run ON CUPTI_ACTIVITY_KIND_KERNEL(runId);
CREATE INDEX runtime_run ON CUPTI_ACTIVITY_KIND_RUNTIME(runId);
CREATE INDEX nvtx_run ON NVTX_EVENTS(runId);
CREATE INDEX samples_case ON samples(caseId);
)sql";

// nsys encodes process and thread in one number: pid in bits 24..47, tid in bits 0..23.
int64_t global_pid(uint32_t pid) { return static_cast<int64_t>(pid) << 24; }
int64_t global_tid(uint32_t pid, uint32_t tid) { return global_pid(pid) | (tid & 0xFFFFFF); }
uint32_t pid_of(int64_t global) { return static_cast<uint32_t>((global >> 24) & 0xFFFFFF); }
uint32_t tid_of(int64_t global) { return static_cast<uint32_t>(global & 0xFFFFFF); }

std::string now_iso8601() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A prepared statement; bind(i, value) with 1-based i, step() until it returns false.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& path, const char* sql) : db_(db), path_(path) {
    FUSEKIT_SQLITE_CHECK(db_, path_, sqlite3_prepare_v2(db_, sql, -1, &stmt_, nullptr));
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, int64_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Statement& bind(int i, double v) { return check(sqlite3_bind_double(stmt_, i, v)); }
  Statement& bind(int i, const std::string& v) {
    return check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Statement& bind_null(int i) { return check(sqlite3_bind_null(stmt_, i)); }

  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    FUSEKIT_SQLITE_CHECK(db_, path_, rc);
    return false;
  }
  void run() {
    step();
    reset();
  }
  void reset() {
    FUSEKIT_SQLITE_CHECK(db_, path_, sqlite3_reset(stmt_));
    FUSEKIT_SQLITE_CHECK(db_, path_, sqlite3_clear_bindings(stmt_));
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string text(int col) const {
    const unsigned char* s = sqlite3_column_text(stmt_, col);
    return s ? std::string(reinterpret_cast<const char*>(s), sqlite3_column_bytes(stmt_, col)) : std::string();
  }

 private:
  Statement& check(int rc) {
    FUSEKIT_SQLITE_CHECK(db_, path_, rc);
    return *this;
  }
  sqlite3* db_;
  const std::string& path_;
  sqlite3_stmt* stmt_ = nullptr;
};

void exec(sqlite3* db, const std::string& path, const char* sql) {
  char* message = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &message);
  if (rc != SQLITE_OK) {
    std::string text = message ? message : sqlite3_errstr(rc);
    sqlite3_free(message);
    throw StoreError(path + ": " + text);
  }
}

// BEGIN IMMEDIATE ... COMMIT, rolled back if anything throws.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) { exec(db_, path_, "BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    exec(db_, path_, "COMMIT");
    committed_ = true;
  }

 private:
  sqlite3* db_;
  const std::string& path_;
  bool committed_ = false;
};

bool file_exists(const std::string& path, off_t* size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  *size = st.st_size;
  return true;
}

bool has_sqlite_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char header[16] = {};
  in.read(header, sizeof header);
  return in.gcount() == 16 && std::string(header, 16) == std::string("SQLite format 3\0", 16);
}

}  // namespace

Store::Store(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
Store::Store(Store&& other) noexcept : path_(std::move(other.path_)), db_(std::exchange(other.db_, nullptr)) {}
Store& Store::operator=(Store&& other) noexcept {
  if (this != &other) {
    if (db_) sqlite3_close(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
  }
  return *this;
}
Store::~Store() {
  if (db_) sqlite3_close(db_);
}

Store Store::open(const std::string& path, Mode mode) {
  off_t size = 0;
  const bool exists = file_exists(path, &size);
  const bool fresh = !exists || size == 0;
  if (!exists && mode != Mode::create) throw StoreError(path + ": no such file");
  if (exists && size == 0 && mode != Mode::create) throw StoreError(path + ": empty file, not a fusekit store");
  if (!fresh && !has_sqlite_header(path)) throw StoreError(path + ": not a fusekit store (not an SQLite file)");

  // An existing file is validated through a read-only handle first: opening a foreign SQLite file
  // (or one with a foreign WAL beside it) read-write could already change it.
  const int flags = fresh ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY;
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Store store(path, raw);
  if (rc != SQLITE_OK) throw StoreError(path + ": cannot open: " + (raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  sqlite3_busy_timeout(raw, 10000);
  sqlite3_extended_result_codes(raw, 1);

  if (fresh) {
    exec(raw, path, "PRAGMA journal_mode=WAL");
    Transaction tx(raw, path);
    exec(raw, path, kSchema);
    exec(raw, path,
         ("INSERT INTO meta(key, value) VALUES ('application', 'fusekit'), ('schema_version', '" +
          std::to_string(kSchemaVersion) + "')")
             .c_str());
    tx.commit();
    return store;
  }

  // Check before writing anything, so a foreign or damaged file stays as it is.
  std::string verdict;
  try {
    Statement check(raw, path, "PRAGMA quick_check");
    verdict = check.step() ? check.text(0) : "no answer";
  } catch (const StoreError&) {
    verdict = sqlite3_errmsg(raw);
  }
  if (verdict != "ok") throw StoreError(path + ": corrupt store (" + verdict + ")");
  {
    Statement has_meta(raw, path, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='meta'");
    has_meta.step();
    if (has_meta.integer(0) == 0)
      throw StoreError(path + ": not a fusekit store (an SQLite file without fusekit's meta table)");
    Statement meta(raw, path, "SELECT key, value FROM meta WHERE key IN ('application', 'schema_version')");
    std::string application, version;
    while (meta.step()) (meta.text(0) == "application" ? application : version) = meta.text(1);
    if (application != "fusekit")
      throw StoreError(path + ": not a fusekit store (meta.application is '" + application + "')");
    if (version != std::to_string(kSchemaVersion)) {
      throw StoreError(path + ": store schema version " + version + ", this fusekit reads version " +
                       std::to_string(kSchemaVersion));
    }
  }
  // Validated. Readers too go through a read-write handle where the file allows, so that the last
  // close checkpoints the WAL and removes the -wal and -shm files instead of leaving them behind.
  sqlite3* writable = nullptr;
  rc = sqlite3_open_v2(path.c_str(), &writable, SQLITE_OPEN_READWRITE, nullptr);
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(writable, 10000);
    sqlite3_extended_result_codes(writable, 1);
    store = Store(path, writable);
    if (mode != Mode::read_only) exec(writable, path, "PRAGMA journal_mode=WAL");
  } else {
    const std::string why = writable ? sqlite3_errmsg(writable) : sqlite3_errstr(rc);
    sqlite3_close(writable);
    if (mode != Mode::read_only) throw StoreError(path + ": cannot open for writing: " + why);
  }
  return store;
}

int64_t Store::string_id(const std::string& value) {
  Statement insert(db_, path_, "INSERT OR IGNORE INTO StringIds(value) VALUES (?)");
  insert.bind(1, value).run();
  Statement select(db_, path_, "SELECT id FROM StringIds WHERE value = ?");
  select.bind(1, value);
  select.step();
  return select.integer(0);
}

int64_t Store::begin_run(RunInfo info) {
  Statement insert(db_, path_,
                   "INSERT INTO runs(startedAt, label, commandLine, gitCommit, host, gpuName, gpuUuid, driverVersion, "
                   "cudaVersion, libtorchVersion, status, droppedRecords) VALUES (?,?,?,?,?,?,?,?,?,?,'running',0)");
  insert.bind(1, info.started_at.empty() ? now_iso8601() : info.started_at)
      .bind(2, info.label)
      .bind(3, info.command_line)
      .bind(4, info.git_commit)
      .bind(5, info.host)
      .bind(6, info.gpu_name)
      .bind(7, info.gpu_uuid)
      .bind(8, info.driver_version)
      .bind(9, info.cuda_version)
      .bind(10, info.libtorch_version);
  insert.run();
  return sqlite3_last_insert_rowid(db_);
}

void Store::finish_run(int64_t run, const std::string& status, int exit_code) {
  Statement update(db_, path_, "UPDATE runs SET status = ?, exitCode = ?, finishedAt = ? WHERE id = ?");
  update.bind(1, status).bind(2, static_cast<int64_t>(exit_code)).bind(3, now_iso8601()).bind(4, run).run();
}

void Store::set_copy_ceiling(int64_t run, double bytes_per_second) {
  Statement update(db_, path_, "UPDATE runs SET copyCeilingBytesPerSecond = ? WHERE id = ?");
  update.bind(1, bytes_per_second).bind(2, run).run();
}

void Store::add_gpu(int64_t run, const GpuInfo& gpu) {
  Statement insert(db_, path_,
                   "INSERT INTO TARGET_INFO_GPU(runId, id, name, uuid, busLocation, totalMemory, smCount, "
                   "computeMajor, computeMinor, l2CacheSize) VALUES (?,?,?,?,?,?,?,?,?,?)");
  insert.bind(1, run)
      .bind(2, static_cast<int64_t>(gpu.device_id))
      .bind(3, gpu.name)
      .bind(4, gpu.uuid)
      .bind(5, gpu.bus_location)
      .bind(6, static_cast<int64_t>(gpu.total_memory))
      .bind(7, static_cast<int64_t>(gpu.sm_count))
      .bind(8, static_cast<int64_t>(gpu.compute_major))
      .bind(9, static_cast<int64_t>(gpu.compute_minor))
      .bind(10, static_cast<int64_t>(gpu.l2_cache_size))
      .run();
}

void Store::append_trace(int64_t run, const profiler::Trace& trace) {
  Transaction tx(db_, path_);
  std::unordered_map<std::string, int64_t> ids;
  auto id_of = [&](const std::string& s) {
    auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    return ids[s] = string_id(s);
  };
  auto i64 = [](auto v) { return static_cast<int64_t>(v); };
  {
    Statement k(db_, path_,
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL(runId, start, end, deviceId, contextId, streamId, "
                "correlationId, globalPid, demangledName, shortName, gridX, gridY, gridZ, blockX, blockY, blockZ, "
                "registersPerThread, staticSharedMemory, dynamicSharedMemory) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    // Parameters 1..8 of a device activity's row: the run, then the record's times, ids and process
    // (its own, else the process that recorded the trace).
    auto bind_activity = [&](Statement& st, const profiler::DeviceActivity& r) -> Statement& {
      const uint32_t process = r.process_id != 0 ? r.process_id : trace.process_id;
      st.bind(1, run).bind(2, i64(r.start)).bind(3, i64(r.end)).bind(4, i64(r.device_id)).bind(5, i64(r.context_id));
      return st.bind(6, i64(r.stream_id)).bind(7, i64(r.correlation_id)).bind(8, global_pid(process));
    };
    for (const auto& r : trace.kernels) {
      bind_activity(k, r);
      k.bind(9, id_of(r.name)).bind(10, id_of(profiler::short_kernel_name(r.name)));
      k.bind(11, i64(r.grid_x)).bind(12, i64(r.grid_y)).bind(13, i64(r.grid_z));
      k.bind(14, i64(r.block_x)).bind(15, i64(r.block_y)).bind(16, i64(r.block_z));
      k.bind(17, i64(r.registers_per_thread))
          .bind(18, i64(r.static_shared_memory))
          .bind(19, i64(r.dynamic_shared_memory));
      k.run();
    }
    Statement m(db_, path_,
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY(runId, start, end, deviceId, contextId, streamId, "
                "correlationId, globalPid, bytes, copyKind, srcKind, dstKind) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
    for (const auto& r : trace.memcpys) {
      bind_activity(m, r).bind(9, i64(r.bytes));
      m.bind(10, i64(r.copy_kind)).bind(11, i64(r.src_kind)).bind(12, i64(r.dst_kind));
      m.run();
    }
    Statement s(db_, path_,
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET(runId, start, end, deviceId, contextId, streamId, "
                "correlationId, globalPid, bytes, value) VALUES (?,?,?,?,?,?,?,?,?,?)");
    for (const auto& r : trace.memsets) {
      bind_activity(s, r).bind(9, i64(r.bytes)).bind(10, i64(r.value));
      s.run();
    }
    Statement a(db_, path_,
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME(runId, start, end, eventClass, globalTid, correlationId, "
                "nameId, returnValue, callbackId) VALUES (?,?,?,?,?,?,?,?,?)");
    for (const auto& r : trace.api_calls) {
      a.bind(1, run).bind(2, i64(r.start)).bind(3, i64(r.end)).bind(4, i64(static_cast<int>(r.kind)));
      a.bind(5, global_tid(r.process_id, r.thread_id)).bind(6, i64(r.correlation_id)).bind(7, id_of(r.name));
      a.bind(8, i64(r.return_value)).bind(9, i64(r.callback_id));
      a.run();
    }
    Statement n(db_, path_,
                "INSERT INTO NVTX_EVENTS(runId, start, end, eventType, text, globalTid, endGlobalTid, domain) "
                "VALUES (?,?,?,?,?,?,?,?)");
    for (const auto& r : trace.ranges) {
      n.bind(1, run).bind(2, i64(r.start));
      if (r.end == 0)
        n.bind_null(3);
      else
        n.bind(3, i64(r.end));
      n.bind(4, i64(r.event_type)).bind(5, r.text).bind(6, global_tid(r.process_id, r.thread_id));
      n.bind(7, global_tid(r.process_id, r.end_thread_id)).bind(8, r.domain);
      n.run();
    }
  }
  if (trace.dropped_records > 0) {
    Statement d(db_, path_, "UPDATE runs SET droppedRecords = droppedRecords + ? WHERE id = ?");
    d.bind(1, i64(trace.dropped_records)).bind(2, run).run();
  }
  tx.commit();
}

int64_t Store::add_case(int64_t run, const CaseInfo& info, const std::vector<double>& samples_ns,
                        const std::vector<CaseMetric>& metrics) {
  for (const CaseMetric& m : metrics) {
    if (m.name.empty() || !std::isfinite(m.value)) {
      throw StoreError(path_ + ": case " + info.name + ": a metric needs a name and a finite value");
    }
  }
  Transaction tx(db_, path_);
  Statement insert(db_, path_,
                   "INSERT INTO cases(runId, name, op, shape, dtype, variant, bytes, flops) VALUES (?,?,?,?,?,?,?,?)");
  insert.bind(1, run).bind(2, info.name).bind(3, info.op).bind(4, info.shape).bind(5, info.dtype);
  insert.bind(6, info.variant).bind(7, info.bytes).bind(8, info.flops).run();
  const int64_t case_id = sqlite3_last_insert_rowid(db_);
  Statement sample(db_, path_, "INSERT INTO samples(caseId, rep, nanoseconds) VALUES (?,?,?)");
  for (size_t i = 0; i < samples_ns.size(); ++i) {
    sample.bind(1, case_id).bind(2, static_cast<int64_t>(i)).bind(3, samples_ns[i]).run();
  }
  if (!metrics.empty()) {
    // Stores made before the table existed get it on their first metric (same schema version: a
    // reader that does not know the table ignores it).
    exec(db_, path_,
         "CREATE TABLE IF NOT EXISTS case_metrics(caseId INTEGER NOT NULL REFERENCES cases(id), name TEXT NOT NULL, "
         "value REAL NOT NULL)");
    Statement metric(db_, path_, "INSERT INTO case_metrics(caseId, name, value) VALUES (?,?,?)");
    for (const CaseMetric& m : metrics) metric.bind(1, case_id).bind(2, m.name).bind(3, m.value).run();
  }
  tx.commit();
  return case_id;
}

namespace {
constexpr const char* kRunColumns =
    "SELECT id, startedAt, finishedAt, label, commandLine, gitCommit, host, gpuName, gpuUuid, driverVersion, "
    "cudaVersion, libtorchVersion, status, exitCode, droppedRecords, copyCeilingBytesPerSecond FROM runs";

RunInfo read_run(const Statement& s) {
  RunInfo r;
  r.id = s.integer(0);
  r.started_at = s.text(1);
  r.finished_at = s.text(2);
  r.label = s.text(3);
  r.command_line = s.text(4);
  r.git_commit = s.text(5);
  r.host = s.text(6);
  r.gpu_name = s.text(7);
  r.gpu_uuid = s.text(8);
  r.driver_version = s.text(9);
  r.cuda_version = s.text(10);
  r.libtorch_version = s.text(11);
  r.status = s.text(12);
  r.exit_code = static_cast<int>(s.integer(13));
  r.dropped_records = static_cast<uint64_t>(s.integer(14));
  r.copy_ceiling_bytes_per_second = s.is_null(15) ? 0.0 : s.real(15);
  return r;
}
}  // namespace

RunInfo Store::run(int64_t id) const {
  Statement s(db_, path_, (std::string(kRunColumns) + " WHERE id = ?").c_str());
  s.bind(1, id);
  if (!s.step()) throw StoreError(path_ + ": no run " + std::to_string(id));
  return read_run(s);
}

int64_t Store::latest_run() const {
  Statement s(db_, path_, "SELECT max(id) FROM runs");
  if (!s.step() || s.is_null(0)) throw StoreError(path_ + ": the store holds no run");
  return s.integer(0);
}

std::vector<RunInfo> Store::runs() const {
  Statement s(db_, path_, (std::string(kRunColumns) + " ORDER BY id").c_str());
  std::vector<RunInfo> out;
  while (s.step()) out.push_back(read_run(s));
  return out;
}

std::vector<GpuInfo> Store::gpus(int64_t run) const {
  Statement s(db_, path_,
              "SELECT id, name, uuid, busLocation, totalMemory, smCount, computeMajor, computeMinor, l2CacheSize "
              "FROM TARGET_INFO_GPU WHERE runId = ? ORDER BY id");
  s.bind(1, run);
  std::vector<GpuInfo> out;
  while (s.step()) {
    GpuInfo g;
    g.device_id = static_cast<uint32_t>(s.integer(0));
    g.name = s.text(1);
    g.uuid = s.text(2);
    g.bus_location = s.text(3);
    g.total_memory = static_cast<uint64_t>(s.integer(4));
    g.sm_count = static_cast<int>(s.integer(5));
    g.compute_major = static_cast<int>(s.integer(6));
    g.compute_minor = static_cast<int>(s.integer(7));
    g.l2_cache_size = static_cast<uint64_t>(s.integer(8));
    out.push_back(g);
  }
  return out;
}

profiler::Trace Store::load_trace(int64_t run_id) const {
  (void)run(run_id);  // a missing run is an error, not an empty trace
  profiler::Trace t;
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  // Columns 0..6 of a device activity's SELECT: start, end, deviceId, contextId, streamId,
  // correlationId, globalPid.
  auto read_activity = [&](Statement& st, profiler::DeviceActivity& r) {
    r.start = static_cast<uint64_t>(st.integer(0));
    r.end = static_cast<uint64_t>(st.integer(1));
    r.device_id = u32(st.integer(2));
    r.context_id = u32(st.integer(3));
    r.stream_id = u32(st.integer(4));
    r.correlation_id = u32(st.integer(5));
    r.process_id = pid_of(st.integer(6));
  };
  {
    Statement s(db_, path_,
                "SELECT k.start, k.end, k.deviceId, k.contextId, k.streamId, k.correlationId, k.globalPid, n.value, "
                "k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.registersPerThread, "
                "k.staticSharedMemory, k.dynamicSharedMemory FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n "
                "ON n.id = k.demangledName WHERE k.runId = ? ORDER BY k.start");
    s.bind(1, run_id);
    while (s.step()) {
      profiler::KernelRecord k;
      read_activity(s, k);
      k.name = s.text(7);
      k.grid_x = static_cast<int32_t>(s.integer(8));
      k.grid_y = static_cast<int32_t>(s.integer(9));
      k.grid_z = static_cast<int32_t>(s.integer(10));
      k.block_x = static_cast<int32_t>(s.integer(11));
      k.block_y = static_cast<int32_t>(s.integer(12));
      k.block_z = static_cast<int32_t>(s.integer(13));
      k.registers_per_thread = static_cast<int32_t>(s.integer(14));
      k.static_shared_memory = static_cast<int32_t>(s.integer(15));
      k.dynamic_shared_memory = static_cast<int32_t>(s.integer(16));
      t.kernels.push_back(std::move(k));
    }
  }
  {
    Statement s(db_, path_,
                "SELECT start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, copyKind, "
                "srcKind, dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ? ORDER BY start");
    s.bind(1, run_id);
    while (s.step()) {
      profiler::MemcpyRecord m;
      read_activity(s, m);
      m.bytes = static_cast<uint64_t>(s.integer(7));
      m.copy_kind = u32(s.integer(8));
      m.src_kind = u32(s.integer(9));
      m.dst_kind = u32(s.integer(10));
      t.memcpys.push_back(m);
    }
  }
  {
    Statement s(db_, path_,
                "SELECT start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, value "
                "FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE runId = ? ORDER BY start");
    s.bind(1, run_id);
    while (s.step()) {
      profiler::MemsetRecord m;
      read_activity(s, m);
      m.bytes = static_cast<uint64_t>(s.integer(7));
      m.value = u32(s.integer(8));
      t.memsets.push_back(m);
    }
  }
  {
    Statement s(db_, path_,
                "SELECT r.start, r.end, r.eventClass, r.globalTid, r.correlationId, n.value, r.returnValue, "
                "r.callbackId FROM CUPTI_ACTIVITY_KIND_RUNTIME r LEFT JOIN StringIds n ON n.id = r.nameId "
                "WHERE r.runId = ? ORDER BY r.start");
    s.bind(1, run_id);
    while (s.step()) {
      profiler::ApiRecord a;
      a.start = static_cast<uint64_t>(s.integer(0));
      a.end = static_cast<uint64_t>(s.integer(1));
      a.kind = s.integer(2) == 2 ? profiler::ApiKind::driver : profiler::ApiKind::runtime;
      a.process_id = pid_of(s.integer(3));
      a.thread_id = tid_of(s.integer(3));
      a.correlation_id = u32(s.integer(4));
      a.name = s.text(5);
      a.return_value = static_cast<int32_t>(s.integer(6));
      a.callback_id = u32(s.integer(7));
      t.api_calls.push_back(std::move(a));
    }
  }
  {
    Statement s(db_, path_,
                "SELECT start, end, eventType, text, globalTid, endGlobalTid, domain FROM NVTX_EVENTS "
                "WHERE runId = ? ORDER BY start");
    s.bind(1, run_id);
    while (s.step()) {
      profiler::RangeRecord r;
      r.start = static_cast<uint64_t>(s.integer(0));
      r.end = s.is_null(1) ? 0 : static_cast<uint64_t>(s.integer(1));
      r.event_type = static_cast<int>(s.integer(2));
      r.text = s.text(3);
      r.process_id = pid_of(s.integer(4));
      r.thread_id = tid_of(s.integer(4));
      r.end_thread_id = tid_of(s.integer(5));
      r.domain = s.text(6);
      t.ranges.push_back(std::move(r));
    }
  }
  t.dropped_records = run(run_id).dropped_records;
  return t;
}

std::vector<StoredCase> Store::load_cases(int64_t run_id) const {
  std::vector<StoredCase> cases;
  Statement s(db_, path_,
              "SELECT id, name, op, shape, dtype, variant, bytes, flops FROM cases WHERE runId = ? ORDER BY id");
  s.bind(1, run_id);
  while (s.step()) {
    StoredCase c;
    c.id = s.integer(0);
    c.info.name = s.text(1);
    c.info.op = s.text(2);
    c.info.shape = s.text(3);
    c.info.dtype = s.text(4);
    c.info.variant = s.text(5);
    c.info.bytes = s.real(6);
    c.info.flops = s.real(7);
    cases.push_back(std::move(c));
  }
  Statement samples(db_, path_, "SELECT nanoseconds FROM samples WHERE caseId = ? ORDER BY rep");
  for (StoredCase& c : cases) {
    samples.bind(1, c.id);
    while (samples.step()) c.samples_ns.push_back(samples.real(0));
    samples.reset();
  }
  Statement has_metrics(db_, path_, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='case_metrics'");
  has_metrics.step();
  if (has_metrics.integer(0) == 0) return cases;
  Statement metrics(db_, path_, "SELECT name, value FROM case_metrics WHERE caseId = ? ORDER BY rowid");
  for (StoredCase& c : cases) {
    metrics.bind(1, c.id);
    while (metrics.step()) c.metrics.push_back({metrics.text(0), metrics.real(1)});
    metrics.reset();
  }
  return cases;
}

}  // namespace fusekit::store
