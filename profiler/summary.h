// Summaries of a trace in the vocabulary of `nsys stats`.
//
// Kernel table: per kernel name, the columns of cuda_gpu_kern_sum (Time %, Total Time, Instances,
// Avg, Med, Min, Max, StdDev, Name). Range table: per NVTX range name, the wall time of its
// instances, the GPU busy time (the union of the intervals of the kernels attributed to the range
// or to ranges nested in it, so overlapping kernels on several streams count once) and the idle
// fraction 1 - busy / extent, where a range's extent runs from its start to its end or to the end
// of its last kernel, whichever is later (kernels run asynchronously, often after the range closed).
// Range breakdown: what the instances of a range hold (a case's traced repetitions), by kernel
// category and by the ranges nested in them (a step's forward, backward, optimizer, layers).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "profiler/attribution.h"
#include "profiler/kernel_category.h"
#include "profiler/records.h"

namespace fusekit::profiler {

struct KernelStats {
  std::string name;
  double time_percent = 0;  // of the total kernel time of the summarized set
  uint64_t total_ns = 0;
  uint64_t instances = 0;
  double avg_ns = 0;
  double med_ns = 0;
  uint64_t min_ns = 0;
  uint64_t max_ns = 0;
  double stddev_ns = 0;  // sample standard deviation; 0 for one instance
};

struct RangeStats {
  std::string name;
  uint64_t instances = 0;
  uint64_t wall_ns = 0;    // summed over instances
  uint64_t busy_ns = 0;    // summed over instances
  uint64_t kernels = 0;    // kernels attributed to the instances or their nested ranges
  uint64_t kernel_ns = 0;  // their summed durations (larger than busy_ns where they overlap)
  double idle_fraction = 0;
  uint64_t extent_ns = 0;  // summed: each instance's start to the later of its end and its last kernel's end
};

struct RunTotals {
  uint64_t wall_ns = 0;  // first to last timestamp of any record
  uint64_t busy_ns = 0;  // union of all kernel intervals
  uint64_t kernel_ns = 0;
  uint64_t kernels = 0;
  uint64_t memcpys = 0;
  uint64_t memcpy_bytes = 0;
  uint64_t memsets = 0;
  uint64_t api_calls = 0;
  uint64_t ranges = 0;
  double idle_fraction = 0;
};

// Sorted by total time, largest first. With `only_range`, only kernels attributed to a range of
// that name or to ranges nested in one; `short_names` groups by short_kernel_name.
std::vector<KernelStats> summarize_kernels(const Trace& trace, const Attribution& attribution,
                                           const std::optional<std::string>& only_range = std::nullopt,
                                           bool short_names = false);

// Sorted by wall time, largest first.
std::vector<RangeStats> summarize_ranges(const Trace& trace, const Attribution& attribution);

RunTotals summarize_run(const Trace& trace);

// Summed durations by category, indexed by the KernelCategory's value.
using CategoryTimes = std::array<uint64_t, kKernelCategories.size()>;

struct NestedRangeTime {
  std::vector<std::string> path;  // range names below the broken-down range, outermost first; repetitions left out
  uint64_t gpu_ns = 0;            // summed durations of the activities inside, ranges nested deeper included
  uint64_t first_start = 0;       // the start of the first instance that holds any of them
};

struct RangeBreakdown {
  std::string name;
  uint64_t instances = 0;
  uint64_t repetitions = 0;  // ranges of the repetition name nested in the instances (0: none)
  uint64_t kernels = 0;
  uint64_t gpu_ns = 0;  // summed durations of the kernels, copies and memsets inside the instances
  CategoryTimes category_ns{};
  // Each nested range path once, before the paths nested in it; siblings in the order they first ran.
  std::vector<NestedRangeTime> nested;
};

// Per name of `names`, in that order, what the ranges of that name hold (instances 0 where no range
// has the name): the kernels (by classify_kernel), copies and memsets (copy/cast) attributed to them
// or to ranges nested in them. Ranges named `repetition` count the repetitions and are left out of
// the nested paths. A range nested in another of `names` belongs to the nearer one only.
std::vector<RangeBreakdown> break_down_ranges(const Trace& trace, const Attribution& attribution,
                                              const std::vector<std::string>& names,
                                              const std::string& repetition = "rep");

// Length of the union of half-open intervals [first, second).
uint64_t union_length(std::vector<std::pair<uint64_t, uint64_t>> intervals);

// Median of a sample (mean of the two middle values for an even count); NaN for none.
double median(std::vector<double> values);

}  // namespace fusekit::profiler
