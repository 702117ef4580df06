// The CUPTI layer: enables activity kinds, receives CUPTI's buffers, turns them into plain records.
//
// Kinds: concurrent kernels, memcpy, memset, runtime and driver API calls, NVTX markers. CUPTI
// delivers buffers through process-wide callbacks, so there is one tracer per process
// (CuptiTracer::instance()). NVTX reaches CUPTI only if NVTX_INJECTION64_PATH names the CUPTI
// library before the process's first NVTX call: prepare_nvtx_injection() sets it, and
// `fusekit trace` sets it for the traced program.
//
// CUPTI does not say whether a marker came from nvtxRangePush/Pop or nvtxRangeStart/End; a range
// closed on its own thread in last-opened-first-closed order is recorded as push/pop (59), any
// other as start/end (60).
#pragma once

#include <cstdint>
#include <string>

#include "profiler/records.h"

namespace fusekit::profiler {

class CuptiTracer {
 public:
  static CuptiTracer& instance();

  // Enables the activity kinds (idempotent). Call before the work to trace.
  void start();
  // Disables them; records already produced stay buffered until flush().
  void stop();
  // Forces CUPTI to hand over every buffer and returns the records gathered since the last flush.
  // Ranges still open stay held back until they close, or, with `final`, are returned unclosed.
  // Synchronize the device first: a record of work still in flight is incomplete, and is counted
  // as dropped rather than returned.
  Trace flush(bool final = false);
  // Returns the records of the buffers CUPTI has filled so far, without forcing out the one it is
  // writing: safe while the GPU is busy (the periodic flush of `fusekit trace`).
  Trace collect_completed();

 private:
  CuptiTracer() = default;
  bool registered_ = false;
  bool running_ = false;
};

// Points NVTX_INJECTION64_PATH at the CUPTI library this program links, unless it is already set.
// Returns the path in effect. Must run before the first NVTX call of the process.
std::string prepare_nvtx_injection();

// The path of the CUPTI library this code calls into, or "" if none is loaded.
std::string cupti_library_path();

}  // namespace fusekit::profiler
