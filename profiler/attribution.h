// Attribution: which NVTX range a kernel (or copy, or memset) belongs to.
//
// A GPU activity belongs to the innermost range that was open on the launching thread when its
// launch call ran: activity.correlation_id -> the API record with that id -> (process, thread,
// call start) -> of the ranges opened on that thread and open at that instant, the one opened
// last. Ranges are half-open intervals [start, end); a range with end == 0 was never closed and
// stays open to the end of the trace.
//
// That misses work launched from threads that open no ranges: PyTorch runs backward on its
// autograd thread, so a step's backward kernels fall outside the "backward" range its main thread
// holds open meanwhile. A projection places such launches by time, as Nsight Systems'
// nvtx_gpu_proj_sum projects ranges: to the innermost range open in the same process, on any
// thread, when the launch call ran (of those open then, the one that started last; at equal
// starts the one that ends first). A range that no range of its own thread encloses is nested the
// same way, so that a library's range on the autograd thread (cub::DeviceRadixSort) lands inside
// the main thread's range too.
//
// Kernels of a CUDA graph carry the correlation id of the graph's launch call (cudaGraphLaunch),
// so every mode places them where the graph was launched; the records keep no graph id.
#pragma once

#include <cstdint>
#include <vector>

#include "profiler/records.h"

namespace fusekit::profiler {

inline constexpr int kNoRange = -1;

enum class RangeProjection {
  none,      // the innermost range open on the launching thread, or no range
  unranged,  // as none; a launch from a thread with no range open at its call is projected by time
  all,       // every launch projected by time: the innermost range open in its process on any thread
};

// "none", "unranged", "all".
const char* projection_name(RangeProjection projection);

struct Attribution {
  std::vector<int> kernel_range;  // per trace.kernels[i]: index into trace.ranges, or kNoRange
  std::vector<int> memcpy_range;
  std::vector<int> memset_range;
  std::vector<int> range_parent;          // per trace.ranges[i]: the range it is nested in, or kNoRange
  size_t kernels_without_api_record = 0;  // no launch call with that correlation id was recorded
  size_t kernels_projected = 0;  // kernels placed by the projection in a range that their thread did not hold open
  RangeProjection projection = RangeProjection::none;
};

Attribution attribute(const Trace& trace, RangeProjection projection = RangeProjection::none);

// True if `range` is `ancestor` or nested (at any depth) inside it.
bool range_within(const Attribution& attribution, int range, int ancestor);

}  // namespace fusekit::profiler
