// read_gpu_conditions: NVML, opened at run time (the rest of gpu_conditions.h is in
// gpu_conditions.cpp, which needs neither CUDA nor NVML).
#include "profiler/gpu_conditions.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <utility>

namespace fusekit::profiler {
namespace {

// The few NVML declarations used, with NVML's own names and values (nvml.h), so that no NVML
// header is needed to build.
using nvmlReturn_t = int;
constexpr nvmlReturn_t kSuccess = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr int kClockSm = 1;
constexpr int kClockMem = 2;
constexpr int kTemperatureGpu = 0;
struct ProcessInfo {  // nvmlProcessInfo_t (v2), what nvmlDeviceGetComputeRunningProcesses_v3 fills
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

struct Nvml {
  void* library = nullptr;
  std::string error;
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*clock_info)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*event_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, ProcessInfo*) = nullptr;

  std::string describe(const char* call, nvmlReturn_t status) const {
    return std::string(call) + ": " + (error_string ? error_string(status) : "NVML error " + std::to_string(status));
  }
};

template <typename F>
void bind(void* library, F& f, const char* name, const char* fallback = nullptr) {
  void* symbol = dlsym(library, name);
  if (!symbol && fallback) symbol = dlsym(library, fallback);
  f = reinterpret_cast<F>(symbol);
}

// Opened and initialized once per process.
const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    n.library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n.library) {
      n.error = "NVML not found (libnvidia-ml.so.1: no NVIDIA driver)";
      return;
    }
    bind(n.library, n.init, "nvmlInit_v2");
    bind(n.library, n.error_string, "nvmlErrorString");
    bind(n.library, n.by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    bind(n.library, n.clock_info, "nvmlDeviceGetClockInfo");
    bind(n.library, n.temperature, "nvmlDeviceGetTemperature");
    bind(n.library, n.power_usage, "nvmlDeviceGetPowerUsage");
    bind(n.library, n.event_reasons, "nvmlDeviceGetCurrentClocksEventReasons",
         "nvmlDeviceGetCurrentClocksThrottleReasons");
    bind(n.library, n.processes, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!n.init || !n.by_pci_bus_id || !n.clock_info || !n.temperature || !n.power_usage || !n.event_reasons) {
      n.error = "NVML lacks a function fusekit reads";
      return;
    }
    const nvmlReturn_t status = n.init();
    if (status != kSuccess) n.error = n.describe("nvmlInit", status);
  });
  return n;
}

}  // namespace

GpuConditions read_gpu_conditions(int cuda_device) {
  GpuConditions c;
  const Nvml& n = nvml();
  if (!n.error.empty()) {
    c.error = n.error;
    return c;
  }
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess) {
    cudaGetLastError();
    c.error = "no CUDA device " + std::to_string(cuda_device);
    return c;
  }
  nvmlDevice_t device = nullptr;
  if (const nvmlReturn_t s = n.by_pci_bus_id(bus_id, &device); s != kSuccess) {
    c.error = n.describe("nvmlDeviceGetHandleByPciBusId", s);
    return c;
  }
  unsigned int sm = 0, memory = 0, temperature = 0, milliwatts = 0;
  unsigned long long reasons = 0;
  for (const auto& [status, call] : {std::pair{n.clock_info(device, kClockSm, &sm), "nvmlDeviceGetClockInfo(SM)"},
                                     {n.clock_info(device, kClockMem, &memory), "nvmlDeviceGetClockInfo(MEM)"},
                                     {n.temperature(device, kTemperatureGpu, &temperature), "nvmlDeviceGetTemperature"},
                                     {n.power_usage(device, &milliwatts), "nvmlDeviceGetPowerUsage"},
                                     {n.event_reasons(device, &reasons), "nvmlDeviceGetCurrentClocksEventReasons"}}) {
    if (status != kSuccess) {
      c.error = n.describe(call, status);
      return c;
    }
  }
  c.available = true;
  c.sm_clock_mhz = sm;
  c.memory_clock_mhz = memory;
  c.temperature_c = temperature;
  c.power_w = milliwatts / 1000.0;
  c.clocks_event_reasons = reasons;
  if (n.processes) {
    ProcessInfo infos[64];
    unsigned int count = 64;
    if (n.processes(device, &count, infos) == kSuccess) {
      const unsigned int self = static_cast<unsigned int>(getpid());
      for (unsigned int i = 0; i < count; ++i) c.other_processes += infos[i].pid != self;
    } else {
      c.other_processes = -1;  // unknown (more than 64, or not permitted)
    }
  }
  return c;
}

}  // namespace fusekit::profiler
