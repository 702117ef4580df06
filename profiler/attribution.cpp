#include "profiler/attribution.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

namespace fusekit::profiler {
namespace {

using ThreadKey = std::pair<uint32_t, uint32_t>;  // (process, thread)

// A point in time on one thread at which we want the innermost open range.
struct Query {
  uint64_t time;
  int* result;
};

uint64_t range_end(const RangeRecord& r) { return r.end == 0 ? std::numeric_limits<uint64_t>::max() : r.end; }

// Answers every query of one thread with one sweep over time: ranges enter the active set at their
// start and leave it at their end; the innermost open range is the active one that started last.
void sweep_thread(const std::vector<RangeRecord>& ranges, const std::vector<int>& thread_ranges,
                  std::vector<Query>& queries) {
  enum : int { kEnd = 0, kStart = 1, kQuery = 2 };  // at equal times: close, open, then ask
  struct Event {
    uint64_t time;
    int type;
    int index;  // range index, or query index
  };
  std::vector<Event> events;
  events.reserve(thread_ranges.size() * 2 + queries.size());
  for (int r : thread_ranges) {
    if (range_end(ranges[r]) <= ranges[r].start) continue;  // empty: contains nothing
    events.push_back({ranges[r].start, kStart, r});
    if (ranges[r].end != 0) events.push_back({ranges[r].end, kEnd, r});
  }
  for (size_t q = 0; q < queries.size(); ++q) events.push_back({queries[q].time, kQuery, static_cast<int>(q)});
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.time, a.type, a.index) < std::tie(b.time, b.type, b.index);
  });
  std::set<std::pair<uint64_t, int>> active;  // (start, range index)
  for (const Event& e : events) {
    switch (e.type) {
      case kEnd:
        active.erase({ranges[e.index].start, e.index});
        break;
      case kStart:
        active.insert({ranges[e.index].start, e.index});
        break;
      default:
        *queries[e.index].result = active.empty() ? kNoRange : active.rbegin()->second;
        break;
    }
  }
}

}  // namespace

Attribution attribute(const Trace& trace) {
  Attribution out;
  out.kernel_range.assign(trace.kernels.size(), kNoRange);
  out.memcpy_range.assign(trace.memcpys.size(), kNoRange);
  out.memset_range.assign(trace.memsets.size(), kNoRange);
  out.range_parent.assign(trace.ranges.size(), kNoRange);

  // Runtime and driver records of one launch can share a correlation id; either gives the thread.
  // Correlation ids are numbered per process, so a run holding several processes keys on both.
  auto key_of = [](uint32_t process, uint32_t correlation) { return (uint64_t{process} << 32) | correlation; };
  std::unordered_map<uint64_t, const ApiRecord*> launch_call;
  launch_call.reserve(trace.api_calls.size());
  for (const ApiRecord& api : trace.api_calls) {
    auto [it, inserted] = launch_call.emplace(key_of(api.process_id, api.correlation_id), &api);
    if (!inserted && api.kind == ApiKind::runtime) it->second = &api;
  }

  std::map<ThreadKey, std::vector<int>> ranges_of_thread;
  for (size_t r = 0; r < trace.ranges.size(); ++r) {
    ranges_of_thread[{trace.ranges[r].process_id, trace.ranges[r].thread_id}].push_back(static_cast<int>(r));
  }
  std::map<ThreadKey, std::vector<Query>> queries_of_thread;

  auto ask = [&](uint32_t process_id, uint32_t correlation_id, int* result) {
    auto it = launch_call.find(key_of(process_id, correlation_id));
    if (it == launch_call.end()) return false;
    const ApiRecord& api = *it->second;
    ThreadKey key{api.process_id, api.thread_id};
    if (ranges_of_thread.count(key)) queries_of_thread[key].push_back({api.start, result});
    return true;
  };
  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    if (!ask(trace.kernels[i].process_id, trace.kernels[i].correlation_id, &out.kernel_range[i]))
      ++out.kernels_without_api_record;
  }
  for (size_t i = 0; i < trace.memcpys.size(); ++i)
    ask(trace.memcpys[i].process_id, trace.memcpys[i].correlation_id, &out.memcpy_range[i]);
  for (size_t i = 0; i < trace.memsets.size(); ++i)
    ask(trace.memsets[i].process_id, trace.memsets[i].correlation_id, &out.memset_range[i]);

  for (auto& [key, queries] : queries_of_thread) sweep_thread(trace.ranges, ranges_of_thread[key], queries);

  // A range's parent: the innermost range of its thread open at its start. Sorted by start (outer
  // first at equal starts), the ranges still open form a stack whose top is that parent.
  for (auto& [key, indices] : ranges_of_thread) {
    std::vector<int> sorted = indices;
    std::sort(sorted.begin(), sorted.end(), [&](int a, int b) {
      const auto& ra = trace.ranges[a];
      const auto& rb = trace.ranges[b];
      if (ra.start != rb.start) return ra.start < rb.start;
      if (range_end(ra) != range_end(rb)) return range_end(ra) > range_end(rb);  // outer first
      return a < b;
    });
    std::vector<int> stack;
    for (int r : sorted) {
      const RangeRecord& range = trace.ranges[r];
      while (!stack.empty() && range_end(trace.ranges[stack.back()]) <= range.start) stack.pop_back();
      if (!stack.empty()) out.range_parent[r] = stack.back();
      stack.push_back(r);
    }
  }
  return out;
}

bool range_within(const Attribution& attribution, int range, int ancestor) {
  for (int r = range; r != kNoRange; r = attribution.range_parent[r]) {
    if (r == ancestor) return true;
  }
  return false;
}

}  // namespace fusekit::profiler
