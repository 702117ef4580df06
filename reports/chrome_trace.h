// A trace in the Chrome Trace Event Format, for Perfetto (ui.perfetto.dev) or chrome://tracing.
//
// GPU work sits on one track per stream under a process "GPU <device>"; NVTX ranges and CUDA API calls on one
// track per host thread under the process "<pid>". Times are microseconds from the earliest record, written
// exactly to the nanosecond. Not obvious: start/end ranges (nvtxRangeStart/End) may overlap without nesting and
// end on another thread, which a thread's stack of complete events cannot show, so they become async events
// ("b"/"e"); push/pop ranges, which always nest, are complete events ("X") like everything else.
#pragma once

#include <cstdint>
#include <string>

#include "profiler/records.h"
#include "reports/run_report.h"

namespace fusekit::reports {

// GPU processes are numbered from here (plus the device id), above any Linux pid (at most 2^22).
inline constexpr int64_t kChromeTraceGpuPidBase = 1'000'000'000;

// Categories ("cat"): kernel, memcpy, memset (GPU tracks); cuda_api, nvtx (host threads); launch (flow arrows
// from an API call to the GPU work of its correlation id). Ranges never closed (end == 0) end at the last
// timestamp of the trace.
std::string chrome_trace_json(const profiler::Trace& trace, const RunInfo& run);

}  // namespace fusekit::reports
