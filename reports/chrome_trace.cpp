#include "reports/chrome_trace.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "reports/json.h"

namespace fusekit::reports {
namespace {

// Index: CUpti_ActivityMemcpyKind.
constexpr std::string_view kCopyKinds[] = {"Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                           "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP"};

class TraceWriter {
 public:
  TraceWriter(uint64_t origin, uint64_t last) : origin_(origin), last_(last) {}

  // Microseconds with three exact decimals.
  static std::string micros(uint64_t ns) {
    const std::string frac = std::to_string(ns % 1000);
    return std::to_string(ns / 1000) + "." + std::string(3 - frac.size(), '0') + frac;
  }
  std::string since_origin(uint64_t t) const { return micros(t > origin_ ? t - origin_ : 0); }
  uint64_t end_of(uint64_t start, uint64_t end) const { return std::max(start, end == 0 ? last_ : end); }

  JsonObject event(std::string_view ph, std::string_view cat, std::string_view name, int64_t pid, int64_t tid,
                   uint64_t ts) const {
    JsonObject e;
    e.add("ph", ph).add("cat", cat).add("name", name).add("pid", pid).add("tid", tid).raw("ts", since_origin(ts));
    return e;
  }
  void complete(std::string_view cat, std::string_view name, int64_t pid, int64_t tid, uint64_t start, uint64_t end,
                const JsonObject& args) {
    const uint64_t stop = end_of(start, end);
    events_.push_back(
        event("X", cat, name, pid, tid, start).raw("dur", micros(stop - start)).raw("args", args.str()).str());
  }
  void add(const JsonObject& e) { events_.push_back(e.str()); }
  void name(std::string_view what, int64_t pid, int64_t tid, const std::string& value) {
    events_.push_back(JsonObject()
                          .add("ph", "M")
                          .add("name", what)
                          .add("pid", pid)
                          .add("tid", tid)
                          .raw("args", JsonObject().add("name", value).str())
                          .str());
  }
  std::string events() const {
    std::string out;
    for (size_t i = 0; i < events_.size(); ++i) out += (i ? ",\n" : "\n") + events_[i];
    return out + "\n";
  }

 private:
  uint64_t origin_, last_;
  std::vector<std::string> events_;
};

std::string triple(int32_t x, int32_t y, int32_t z) {
  return "[" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + "]";
}

}  // namespace

std::string chrome_trace_json(const profiler::Trace& trace, const RunInfo& run) {
  uint64_t origin = std::numeric_limits<uint64_t>::max(), last = 0;
  const auto span = [&](const auto& records) {
    for (const auto& r : records) {
      origin = std::min(origin, r.start);
      last = std::max({last, r.start, r.end});
    }
  };
  span(trace.kernels);
  span(trace.memcpys);
  span(trace.memsets);
  span(trace.api_calls);
  span(trace.ranges);
  if (origin > last) origin = last = 0;
  TraceWriter w(origin, last);

  const auto host_pid = [&](uint32_t pid) { return static_cast<int64_t>(pid ? pid : trace.process_id); };
  const auto gpu_pid = [](uint32_t device) { return kChromeTraceGpuPidBase + device; };
  std::set<std::pair<int64_t, int64_t>> streams, threads;  // (pid, tid) of the tracks used

  // The API call of each correlation id, for the flow arrows; runtime calls win over the driver calls under them.
  // Keyed by (process, correlation id): each process numbers its own.
  std::map<std::pair<uint32_t, uint32_t>, const profiler::ApiRecord*> launches;
  for (const profiler::ApiRecord& a : trace.api_calls) {
    const int64_t pid = host_pid(a.process_id);
    threads.insert({pid, a.thread_id});
    w.complete("cuda_api", a.name, pid, a.thread_id, a.start, a.end,
               JsonObject()
                   .add("kind", a.kind == profiler::ApiKind::runtime ? "runtime" : "driver")
                   .add("correlation_id", a.correlation_id)
                   .add("callback_id", a.callback_id)
                   .add("return_value", a.return_value));
    auto [at, inserted] = launches.emplace(std::make_pair(a.process_id, a.correlation_id), &a);
    if (!inserted && a.kind == profiler::ApiKind::runtime) at->second = &a;
  }
  uint64_t flow_id = 0;
  const auto flow = [&](uint32_t process_id, uint32_t correlation_id, int64_t pid, int64_t tid, uint64_t start) {
    const auto at = launches.find(std::make_pair(process_id, correlation_id));
    if (at == launches.end()) return;
    const profiler::ApiRecord& a = *at->second;
    ++flow_id;
    w.add(w.event("s", "launch", "launch", host_pid(a.process_id), a.thread_id, a.start).add("id", flow_id));
    w.add(w.event("f", "launch", "launch", pid, tid, start).add("id", flow_id).add("bp", "e"));
  };

  for (const profiler::KernelRecord& k : trace.kernels) {
    const int64_t pid = gpu_pid(k.device_id);
    streams.insert({pid, k.stream_id});
    w.complete("kernel", k.name, pid, k.stream_id, k.start, k.end,
               JsonObject()
                   .add("grid", triple(k.grid_x, k.grid_y, k.grid_z))
                   .add("block", triple(k.block_x, k.block_y, k.block_z))
                   .add("registers_per_thread", k.registers_per_thread)
                   .add("static_shared_memory", k.static_shared_memory)
                   .add("dynamic_shared_memory", k.dynamic_shared_memory)
                   .add("correlation_id", k.correlation_id)
                   .add("device", k.device_id)
                   .add("context", k.context_id)
                   .add("stream", k.stream_id));
    flow(k.process_id, k.correlation_id, pid, k.stream_id, k.start);
  }
  for (const profiler::MemcpyRecord& m : trace.memcpys) {
    const int64_t pid = gpu_pid(m.device_id);
    streams.insert({pid, m.stream_id});
    const std::string_view kind = m.copy_kind < std::size(kCopyKinds) ? kCopyKinds[m.copy_kind] : "Unknown";
    w.complete("memcpy", "Memcpy " + std::string(kind), pid, m.stream_id, m.start, m.end,
               JsonObject()
                   .add("bytes", m.bytes)
                   .add("copy_kind", m.copy_kind)
                   .add("src_kind", m.src_kind)
                   .add("dst_kind", m.dst_kind)
                   .add("correlation_id", m.correlation_id)
                   .add("stream", m.stream_id));
    flow(m.process_id, m.correlation_id, pid, m.stream_id, m.start);
  }
  for (const profiler::MemsetRecord& m : trace.memsets) {
    const int64_t pid = gpu_pid(m.device_id);
    streams.insert({pid, m.stream_id});
    w.complete("memset", "Memset", pid, m.stream_id, m.start, m.end,
               JsonObject()
                   .add("bytes", m.bytes)
                   .add("value", m.value)
                   .add("correlation_id", m.correlation_id)
                   .add("stream", m.stream_id));
    flow(m.process_id, m.correlation_id, pid, m.stream_id, m.start);
  }
  uint64_t async_id = 0;
  for (const profiler::RangeRecord& r : trace.ranges) {
    const int64_t pid = host_pid(r.process_id);
    threads.insert({pid, r.thread_id});
    JsonObject args;
    if (!r.domain.empty()) args.add("domain", r.domain);
    if (r.end == 0) args.add("never_closed", true);
    if (r.event_type != profiler::kNvtxStartEndRange) {
      w.complete("nvtx", r.text, pid, r.thread_id, r.start, r.end, args);
      continue;
    }
    const uint32_t end_thread = r.end_thread_id ? r.end_thread_id : r.thread_id;
    threads.insert({pid, end_thread});
    ++async_id;
    w.add(w.event("b", "nvtx", r.text, pid, r.thread_id, r.start).add("id", async_id).raw("args", args.str()));
    w.add(w.event("e", "nvtx", r.text, pid, end_thread, w.end_of(r.start, r.end)).add("id", async_id));
  }

  std::set<int64_t> processes;
  for (const auto& [pid, stream] : streams) {
    if (processes.insert(pid).second)
      w.name("process_name", pid, 0, "GPU " + std::to_string(pid - kChromeTraceGpuPidBase));
    w.name("thread_name", pid, stream, "Stream " + std::to_string(stream));
  }
  for (const auto& [pid, tid] : threads) {
    if (processes.insert(pid).second) w.name("process_name", pid, 0, std::to_string(pid));
    w.name("thread_name", pid, tid, "Thread " + std::to_string(tid));
  }

  const std::string gpu = run.gpu_name + (run.gpu_uuid.empty() ? "" : " (" + run.gpu_uuid + ")");
  const std::string other = JsonObject()
                                .add("run_id", std::to_string(run.id))
                                .add("label", run.label)
                                .add("git_commit", run.git_commit)
                                .add("gpu", gpu)
                                .add("command_line", run.command_line)
                                .add("started_at", run.started_at)
                                .add("time_origin_ns", std::to_string(origin))
                                .add("dropped_records", std::to_string(trace.dropped_records))
                                .str();
  return "{\"displayTimeUnit\":\"ns\",\"otherData\":" + other + ",\"traceEvents\":[" + w.events() + "]}\n";
}

}  // namespace fusekit::reports
