// Attribution: which NVTX range a kernel (or copy, or memset) belongs to.
//
// A GPU activity belongs to the innermost range that was open on the launching thread when its
// launch call ran: activity.correlation_id -> the API record with that id -> (process, thread,
// call start) -> of the ranges opened on that thread and open at that instant, the one opened
// last. Ranges are half-open intervals [start, end); a range with end == 0 was never closed and
// stays open to the end of the trace.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/records.h"

namespace fusekit::profiler {

inline constexpr int kNoRange = -1;

struct Attribution {
  std::vector<int> kernel_range;  // per trace.kernels[i]: index into trace.ranges, or kNoRange
  std::vector<int> memcpy_range;
  std::vector<int> memset_range;
  std::vector<int> range_parent;          // per trace.ranges[i]: the range it is nested in, or kNoRange
  size_t kernels_without_api_record = 0;  // no launch call with that correlation id was recorded
};

Attribution attribute(const Trace& trace);

// True if `range` is `ancestor` or nested (at any depth) inside it.
bool range_within(const Attribution& attribution, int range, int ancestor);

}  // namespace fusekit::profiler
