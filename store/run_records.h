// The records a store reads and writes: a run, a case, a case with its samples.
//
// These are raw records, as stored; what is derived from them (medians, quartiles, speedups,
// bandwidth, kernel shares) is computed by reports/ on read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusekit::store {

struct RunInfo {
  int64_t id = 0;
  std::string started_at;  // ISO 8601, UTC
  std::string finished_at;
  std::string label;
  std::string command_line;
  std::string git_commit;
  std::string host;
  std::string gpu_name;
  std::string gpu_uuid;
  std::string driver_version;
  std::string cuda_version;
  std::string libtorch_version;
  std::string status;  // running | ok | failed
  int exit_code = 0;
  uint64_t dropped_records = 0;
  double copy_ceiling_bytes_per_second = 0;  // measured device copy bandwidth; 0 if unknown
};

// A benchmark case: `name` identifies what is computed (e.g. "layernorm/8192x768/fp16/fwd");
// `variant` says how (baseline | fused | peer:eager | peer:compile). Variants of one name compute
// the same thing, so their medians give speedups.
struct CaseInfo {
  std::string name;
  std::string op;
  std::string shape;
  std::string dtype;
  std::string variant;
  double bytes = 0;  // bytes that must move: each input read once, each output written once
  double flops = 0;
};

// A number measured once per case besides its timings, by name: "peak_memory_bytes" (the device
// memory a variant held at its peak while the case ran: what it allocated, not what an allocator
// cached). Stored in the table case_metrics (one row per case and name); stores written before it
// existed have none.
struct CaseMetric {
  std::string name;
  double value = 0;
};

// A case as stored: its row id, what it is, every timed repetition in order, and its metrics.
struct StoredCase {
  int64_t id = 0;
  CaseInfo info;
  std::vector<double> samples_ns;
  std::vector<CaseMetric> metrics;
};

}  // namespace fusekit::store
