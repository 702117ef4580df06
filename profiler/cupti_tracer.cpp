#include "profiler/cupti_tracer.h"

#include <cupti.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace fusekit::profiler {
namespace {

// The one checking macro for CUPTI: file, line, the call and CUPTI's own message.
#define FUSEKIT_CUPTI_CHECK(call)                                                                      \
  do {                                                                                                 \
    CUptiResult fusekit_status_ = (call);                                                              \
    if (fusekit_status_ != CUPTI_SUCCESS) {                                                            \
      const char* fusekit_message_ = nullptr;                                                          \
      cuptiGetResultString(fusekit_status_, &fusekit_message_);                                        \
      throw std::runtime_error(std::string("CUPTI error: ") + #call + " failed at " + __FILE__ + ":" + \
                               std::to_string(__LINE__) + ": " +                                       \
                               (fusekit_message_ ? fusekit_message_ : "unknown error"));               \
    }                                                                                                  \
  } while (0)

constexpr size_t kBufferBytes = 8u << 20;
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_MARKER,
};

struct OpenRange {
  RangeRecord record;
  bool has_start = false;
  bool has_end = false;
  bool closed_in_order = false;
};

// Everything CUPTI's callbacks hand over, guarded by one mutex: buffers complete on CUPTI's thread.
struct Pending {
  std::mutex mutex;
  Trace trace;
  std::unordered_map<uint32_t, OpenRange> open_ranges;                    // marker id -> range
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>> stacks;  // (pid, tid) -> open marker ids
  std::unordered_map<uint64_t, std::string> api_names;                    // (domain << 32 | cbid) -> name
};

Pending& pending() {
  static Pending* p = new Pending;  // never destroyed: CUPTI may call back during exit
  return *p;
}

const std::string& api_name(Pending& p, CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const uint64_t key = (static_cast<uint64_t>(domain) << 32) | cbid;
  auto it = p.api_names.find(key);
  if (it != p.api_names.end()) return it->second;
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr) name = "unknown";
  return p.api_names.emplace(key, name).first->second;
}

void on_marker(Pending& p, const CUpti_ActivityMarker2& m) {
  if (m.objectKind != CUPTI_ACTIVITY_OBJECT_THREAD) return;
  const uint32_t pid = m.objectId.pt.processId;
  const uint32_t tid = m.objectId.pt.threadId;
  if (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
    OpenRange& r = p.open_ranges[m.id];
    r.has_start = true;
    r.record.start = m.timestamp;
    r.record.process_id = pid;
    r.record.thread_id = tid;
    r.record.text = m.name ? m.name : "";
    r.record.domain = m.domain ? m.domain : "";
    p.stacks[{pid, tid}].push_back(m.id);
  } else if (m.flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
    OpenRange& r = p.open_ranges[m.id];
    r.has_end = true;
    r.record.end = m.timestamp;
    r.record.end_thread_id = tid;
    auto& stack = p.stacks[{pid, tid}];
    r.closed_in_order = !stack.empty() && stack.back() == m.id;
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
      if (*it == m.id) {
        stack.erase(std::next(it).base());
        break;
      }
    }
  }
  auto it = p.open_ranges.find(m.id);
  if (it != p.open_ranges.end() && it->second.has_start && it->second.has_end) {
    OpenRange& r = it->second;
    const bool push_pop = r.closed_in_order && r.record.end_thread_id == r.record.thread_id;
    r.record.event_type = push_pop ? kNvtxPushPopRange : kNvtxStartEndRange;
    p.trace.ranges.push_back(std::move(r.record));
    p.open_ranges.erase(it);
  }
}

void convert(Pending& p, const CUpti_Activity* record) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto& k = *reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      if (k.start == 0 || k.end < k.start) {  // forced out while still running: incomplete
        ++p.trace.dropped_records;
        break;
      }
      KernelRecord r;
      r.start = k.start;
      r.end = k.end;
      r.device_id = k.deviceId;
      r.context_id = k.contextId;
      r.stream_id = k.streamId;
      r.correlation_id = k.correlationId;
      r.process_id = p.trace.process_id;
      r.name = demangle(k.name);
      r.grid_x = k.gridX;
      r.grid_y = k.gridY;
      r.grid_z = k.gridZ;
      r.block_x = k.blockX;
      r.block_y = k.blockY;
      r.block_z = k.blockZ;
      r.registers_per_thread = k.registersPerThread;
      r.static_shared_memory = k.staticSharedMemory;
      r.dynamic_shared_memory = k.dynamicSharedMemory;
      p.trace.kernels.push_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      if (m.start == 0 || m.end < m.start) {
        ++p.trace.dropped_records;
        break;
      }
      p.trace.memcpys.push_back({m.start, m.end, m.deviceId, m.contextId, m.streamId, m.correlationId,
                                 p.trace.process_id, m.bytes, m.copyKind, m.srcKind, m.dstKind});
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      if (m.start == 0 || m.end < m.start) {
        ++p.trace.dropped_records;
        break;
      }
      p.trace.memsets.push_back(
          {m.start, m.end, m.deviceId, m.contextId, m.streamId, m.correlationId, p.trace.process_id, m.bytes, m.value});
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto& a = *reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const bool runtime = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
      ApiRecord r;
      r.start = a.start;
      r.end = a.end;
      r.process_id = a.processId;
      r.thread_id = a.threadId;
      r.correlation_id = a.correlationId;
      r.callback_id = a.cbid;
      r.kind = runtime ? ApiKind::runtime : ApiKind::driver;
      r.return_value = static_cast<int32_t>(a.returnValue);
      r.name = api_name(p, runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a.cbid);
      p.trace.api_calls.push_back(std::move(r));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MARKER:
      on_marker(p, *reinterpret_cast<const CUpti_ActivityMarker2*>(record));
      break;
    default:
      break;
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid_size) {
  Pending& p = pending();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) convert(p, record);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS) {
      p.trace.dropped_records += dropped;
    }
  }
  std::free(buffer);
}

// The records gathered so far; the pending trace starts over, keeping the process id. Hold p.mutex.
Trace take_trace(Pending& p) {
  Trace out = std::move(p.trace);
  p.trace = Trace{};
  p.trace.process_id = out.process_id;
  return out;
}

}  // namespace

CuptiTracer& CuptiTracer::instance() {
  static CuptiTracer tracer;
  return tracer;
}

void CuptiTracer::start() {
  if (running_) return;
  if (!registered_) {
    // System thread ids (gettid), so API records and NVTX markers name threads the same way.
    FUSEKIT_CUPTI_CHECK(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
    FUSEKIT_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    pending().trace.process_id = static_cast<uint32_t>(getpid());
    registered_ = true;
  }
  for (CUpti_ActivityKind kind : kKinds) FUSEKIT_CUPTI_CHECK(cuptiActivityEnable(kind));
  running_ = true;
}

void CuptiTracer::stop() {
  if (!running_) return;
  for (CUpti_ActivityKind kind : kKinds) FUSEKIT_CUPTI_CHECK(cuptiActivityDisable(kind));
  running_ = false;
}

Trace CuptiTracer::collect_completed() {
  if (registered_) FUSEKIT_CUPTI_CHECK(cuptiActivityFlushAll(0));
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mutex);
  return take_trace(p);
}

Trace CuptiTracer::flush(bool final) {
  if (registered_) FUSEKIT_CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (final) {
    for (auto& [id, r] : p.open_ranges) {
      if (!r.has_start) continue;  // an end whose start was never seen: nothing to show
      r.record.end = 0;
      r.record.event_type = kNvtxPushPopRange;
      p.trace.ranges.push_back(std::move(r.record));
    }
    p.open_ranges.clear();
    p.stacks.clear();
  }
  return take_trace(p);
}

std::string cupti_library_path() {
  // The copy this code is bound to: a process can hold two (PyTorch ships its own), and NVTX must
  // reach the one whose activity buffers we read.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuptiActivityFlushAll), &info) != 0 && info.dli_fname &&
      std::string(info.dli_fname).find("cupti") != std::string::npos) {
    return info.dli_fname;
  }
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        std::string name = info->dlpi_name ? info->dlpi_name : "";
        if (name.find("libcupti.so") == std::string::npos) return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &found);
  return found;
}

std::string prepare_nvtx_injection() {
  const char* existing = std::getenv("NVTX_INJECTION64_PATH");
  if (existing && *existing) return existing;
  std::string path = cupti_library_path();
  if (!path.empty()) setenv("NVTX_INJECTION64_PATH", path.c_str(), 0);
  return path;
}

}  // namespace fusekit::profiler
