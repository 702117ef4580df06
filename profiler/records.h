// Plain records of what ran: kernels, copies, memsets, CUDA API calls and NVTX ranges.
//
// These are the tracer's output and the store's input, free of any CUPTI type, so that
// attribution, summaries, the store and the writers can be built and tested without a GPU.
// Times are nanoseconds on CUPTI's clock (cuptiGetTimestamp), which all record kinds share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusekit::profiler {

// What every record of work on the device has (a kernel, a copy, a memset).
struct DeviceActivity {
  uint64_t start = 0;
  uint64_t end = 0;
  uint32_t device_id = 0;
  uint32_t context_id = 0;
  uint32_t stream_id = 0;
  uint32_t correlation_id = 0;
  uint32_t process_id = 0;  // correlation ids are numbered per process
};

struct KernelRecord : DeviceActivity {
  std::string name;  // demangled where the name could be demangled
  int32_t grid_x = 0, grid_y = 0, grid_z = 0;
  int32_t block_x = 0, block_y = 0, block_z = 0;
  int32_t registers_per_thread = 0;
  int32_t static_shared_memory = 0;
  int32_t dynamic_shared_memory = 0;
};

// copy_kind, src_kind and dst_kind keep CUPTI's enumerations (CUpti_ActivityMemcpyKind,
// CUpti_ActivityMemoryKind), as the Nsight Systems export does.
struct MemcpyRecord : DeviceActivity {
  uint64_t bytes = 0;
  uint32_t copy_kind = 0;
  uint32_t src_kind = 0;
  uint32_t dst_kind = 0;
};

struct MemsetRecord : DeviceActivity {
  uint64_t bytes = 0;
  uint32_t value = 0;
};

enum class ApiKind : int { runtime = 1, driver = 2 };

struct ApiRecord {
  uint64_t start = 0;
  uint64_t end = 0;
  uint32_t process_id = 0;
  uint32_t thread_id = 0;  // the system thread id (gettid)
  uint32_t correlation_id = 0;
  uint32_t callback_id = 0;
  ApiKind kind = ApiKind::runtime;
  int32_t return_value = 0;
  std::string name;
};

// Event types as the Nsight Systems export writes them in NVTX_EVENTS.eventType.
inline constexpr int kNvtxPushPopRange = 59;
inline constexpr int kNvtxStartEndRange = 60;

struct RangeRecord {
  uint64_t start = 0;
  uint64_t end = 0;
  uint32_t process_id = 0;
  uint32_t thread_id = 0;      // the thread that opened the range
  uint32_t end_thread_id = 0;  // the thread that closed it (differs only for start/end ranges)
  int event_type = kNvtxPushPopRange;
  std::string text;
  std::string domain;  // empty for NVTX's default domain
};

// A GPU as the run saw it (TARGET_INFO_GPU).
struct GpuInfo {
  uint32_t device_id = 0;
  std::string name;
  std::string uuid;
  std::string bus_location;
  uint64_t total_memory = 0;
  int sm_count = 0;
  int compute_major = 0;
  int compute_minor = 0;
  uint64_t l2_cache_size = 0;
};

// One process's capture, or one flush of it.
struct Trace {
  std::vector<KernelRecord> kernels;
  std::vector<MemcpyRecord> memcpys;
  std::vector<MemsetRecord> memsets;
  std::vector<ApiRecord> api_calls;
  std::vector<RangeRecord> ranges;
  uint64_t dropped_records = 0;
  uint32_t process_id = 0;  // the process that recorded it

  bool empty() const {
    return kernels.empty() && memcpys.empty() && memsets.empty() && api_calls.empty() && ranges.empty() &&
           dropped_records == 0;
  }
  void append(Trace&& other);
};

// Kernel names as `nsys stats` shows them short: the demangled name without return type,
// namespaces, template arguments and parameters ("void ns::gemm<float, 4>(float*)" -> "gemm").
std::string short_kernel_name(const std::string& demangled);

// Demangles an Itanium C++ name; returns the input unchanged if it is not a mangled name.
std::string demangle(const char* mangled);

}  // namespace fusekit::profiler
