// The fusekit store: one SQLite file holding runs, their traces and their timing samples.
//
// Trace tables use the names and columns of the Nsight Systems SQLite export
// (CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, NVTX_EVENTS, StringIds,
// TARGET_INFO_GPU), so queries written for nsys exports run here; every trace row also carries
// the runId it belongs to. fusekit's own tables are meta, runs, cases and samples.
//
// Opening never writes into a file that is not a fusekit store: the file is checked (SQLite
// header, integrity, meta.application, meta.schema_version) before anything, WAL mode included,
// is written. Each append is one transaction, so a process killed midway leaves every earlier
// append readable.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "profiler/records.h"
#include "store/run_records.h"

struct sqlite3;

namespace fusekit::store {

inline constexpr int kSchemaVersion = 1;

// Thrown for every store failure; what() is one line that names the file.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using profiler::GpuInfo;

class Store {
 public:
  enum class Mode {
    read_only,   // the file must be a fusekit store
    read_write,  // likewise
    create,      // a fusekit store is opened, a missing (or empty) file becomes a new one
  };

  static Store open(const std::string& path, Mode mode);
  Store(Store&& other) noexcept;
  Store& operator=(Store&& other) noexcept;
  ~Store();

  const std::string& path() const { return path_; }

  // Runs. begin_run records started_at and status "running"; finish_run sets status and end time.
  int64_t begin_run(RunInfo info);
  void finish_run(int64_t run, const std::string& status, int exit_code);
  void set_copy_ceiling(int64_t run, double bytes_per_second);
  void add_gpu(int64_t run, const GpuInfo& gpu);

  // One transaction; adds trace.dropped_records to the run's count.
  void append_trace(int64_t run, const profiler::Trace& trace);
  // One transaction: the case, all its samples and its metrics (names non-empty, values finite).
  int64_t add_case(int64_t run, const CaseInfo& info, const std::vector<double>& samples_ns,
                   const std::vector<CaseMetric>& metrics = {});

  RunInfo run(int64_t id) const;      // throws StoreError if there is no such run
  int64_t latest_run() const;         // throws StoreError if the store has no run
  std::vector<RunInfo> runs() const;  // every run, by id
  std::vector<GpuInfo> gpus(int64_t run) const;
  profiler::Trace load_trace(int64_t run) const;
  std::vector<StoredCase> load_cases(int64_t run) const;  // in the order they were added

 private:
  Store(std::string path, sqlite3* db);
  int64_t string_id(const std::string& value);
  std::string path_;
  sqlite3* db_ = nullptr;
};

}  // namespace fusekit::store
