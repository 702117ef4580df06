// What a run records about where it ran: host, fusekit's commit, GPUs, driver and CUDA versions.
// Uses the CUDA runtime only (no driver library at link time), so it runs, and reports no GPU,
// on machines without one.
#pragma once

#include <string>
#include <vector>

#include "profiler/records.h"

namespace fusekit::profiler {

struct Environment {
  std::string host;
  std::string git_commit;
  std::string driver_version;    // e.g. "13.0" (the CUDA version the driver supports), "" without a driver
  std::string runtime_version;   // the CUDA runtime fusekit was built with
  std::string libtorch_version;  // the libtorch fusekit's baselines were built with, "" without
  std::vector<GpuInfo> gpus;
  std::string gpu_error;  // why no GPU was found, if none was
};

Environment read_environment();

// Throws std::invalid_argument where FUSEKIT_GIT_COMMIT is set to anything but a full commit id:
// commands call it before they create a store, so that bad input leaves nothing behind.
void check_commit_override();

// "" if none; otherwise the reason (e.g. "no CUDA-capable device is detected").
std::string gpu_unavailable_reason();

}  // namespace fusekit::profiler
