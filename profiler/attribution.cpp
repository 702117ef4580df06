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

// Ranges in the order in which they nest: by start, then the later end first (an enclosing range
// before the ranges it holds), then by index. Of the ranges open at an instant, the innermost is
// the greatest.
using NestingKey = std::tuple<uint64_t, uint64_t, int>;

NestingKey nesting_key(const std::vector<RangeRecord>& ranges, int r) {
  return {ranges[r].start, std::numeric_limits<uint64_t>::max() - range_end(ranges[r]), r};
}

// The projection within one process: every query gets the innermost range open at its time on any
// of the process's threads; each range marked in `reparent` gets as parent the innermost range open
// at its start that precedes it in nesting order (so parents never form a cycle).
void sweep_process(const std::vector<RangeRecord>& ranges, const std::vector<int>& process_ranges,
                   std::vector<Query>& queries, const std::vector<bool>& reparent, std::vector<int>& range_parent) {
  enum : int { kEnd = 0, kStart = 1, kQuery = 2 };  // at equal times: close, open (enclosing first), then ask
  struct Event {
    uint64_t time;
    int type;
    NestingKey key;  // for starts; the index alone orders ends and queries
  };
  std::vector<Event> events;
  events.reserve(process_ranges.size() * 2 + queries.size());
  for (int r : process_ranges) {
    if (range_end(ranges[r]) <= ranges[r].start) continue;  // empty: contains nothing
    events.push_back({ranges[r].start, kStart, nesting_key(ranges, r)});
    if (ranges[r].end != 0) events.push_back({ranges[r].end, kEnd, {0, 0, r}});
  }
  for (size_t q = 0; q < queries.size(); ++q) events.push_back({queries[q].time, kQuery, {0, 0, static_cast<int>(q)}});
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.time, a.type, a.key) < std::tie(b.time, b.type, b.key);
  });
  std::set<NestingKey> active;
  for (const Event& e : events) {
    const int index = std::get<2>(e.key);
    switch (e.type) {
      case kEnd:
        active.erase(nesting_key(ranges, index));
        break;
      case kStart:
        if (reparent[index] && !active.empty()) range_parent[index] = std::get<2>(*active.rbegin());
        active.insert(e.key);
        break;
      default:
        *queries[index].result = active.empty() ? kNoRange : std::get<2>(*active.rbegin());
        break;
    }
  }
}

}  // namespace

const char* projection_name(RangeProjection projection) {
  switch (projection) {
    case RangeProjection::none:
      return "none";
    case RangeProjection::unranged:
      return "unranged";
    case RangeProjection::all:
      return "all";
  }
  return "none";
}

Attribution attribute(const Trace& trace, RangeProjection projection) {
  Attribution out;
  out.projection = projection;
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
  struct Launch {
    uint32_t process_id;
    uint64_t time;
    int* result;
  };
  std::vector<Launch> launches;  // every activity with a launch call, for the projection

  auto ask = [&](uint32_t process_id, uint32_t correlation_id, int* result) {
    auto it = launch_call.find(key_of(process_id, correlation_id));
    if (it == launch_call.end()) return false;
    const ApiRecord& api = *it->second;
    ThreadKey key{api.process_id, api.thread_id};
    if (ranges_of_thread.count(key)) queries_of_thread[key].push_back({api.start, result});
    if (projection != RangeProjection::none) launches.push_back({api.process_id, api.start, result});
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
  if (projection == RangeProjection::none) return out;

  // The projection, one sweep a process. Under `unranged` only launches that their thread placed
  // in no range, and ranges that no range of their own thread encloses, are projected.
  const std::vector<int> own_kernel_range = out.kernel_range;
  std::map<uint32_t, std::vector<int>> ranges_of_process;
  for (size_t r = 0; r < trace.ranges.size(); ++r)
    ranges_of_process[trace.ranges[r].process_id].push_back(static_cast<int>(r));
  std::map<uint32_t, std::vector<Query>> queries_of_process;
  for (const Launch& launch : launches) {
    if (projection == RangeProjection::all || *launch.result == kNoRange) {
      queries_of_process[launch.process_id].push_back({launch.time, launch.result});
    }
  }
  std::vector<bool> reparent(trace.ranges.size());
  for (size_t r = 0; r < trace.ranges.size(); ++r)
    reparent[r] = projection == RangeProjection::all || out.range_parent[r] == kNoRange;
  for (auto& [process, indices] : ranges_of_process) {
    std::vector<Query> none;
    auto queries = queries_of_process.find(process);
    sweep_process(trace.ranges, indices, queries == queries_of_process.end() ? none : queries->second, reparent,
                  out.range_parent);
  }
  for (size_t i = 0; i < trace.kernels.size(); ++i) {
    if (out.kernel_range[i] != own_kernel_range[i]) ++out.kernels_projected;
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
