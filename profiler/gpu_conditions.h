// The conditions a GPU was timed under, read through NVML: SM and memory clocks, temperature,
// power draw, the reasons the driver is holding the clocks down, and other processes computing on
// the same GPU. The runner reads them before and after each case's timed repetitions and stores
// them with the case (store/run_records.h CaseMetric "gpu.<name>.<start|end>"); the gate compares
// the two runs' conditions and marks cases timed while the GPU throttled.
//
// NVML is opened at run time (dlopen of libnvidia-ml.so.1, which the driver installs), so nothing
// links against it and a machine without a driver gets `available = false` with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusekit::profiler {

// NVML's clocks event ("throttle") reasons, nvmlClocksEventReason*.
namespace clocks_event {
constexpr uint64_t gpu_idle = 0x1;
constexpr uint64_t applications_clocks_setting = 0x2;
constexpr uint64_t sw_power_cap = 0x4;
constexpr uint64_t hw_slowdown = 0x8;
constexpr uint64_t sync_boost = 0x10;
constexpr uint64_t sw_thermal_slowdown = 0x20;
constexpr uint64_t hw_thermal_slowdown = 0x40;
constexpr uint64_t hw_power_brake_slowdown = 0x80;
constexpr uint64_t display_clock_setting = 0x100;
// The reasons that hold the clocks below what the GPU would run a busy kernel at: a case timed
// under one of them ran slower than the GPU can.
constexpr uint64_t throttling =
    sw_power_cap | hw_slowdown | sw_thermal_slowdown | hw_thermal_slowdown | hw_power_brake_slowdown;
}  // namespace clocks_event

struct GpuConditions {
  bool available = false;
  std::string error;  // why not, where not available
  double sm_clock_mhz = 0;
  double memory_clock_mhz = 0;
  double temperature_c = 0;
  double power_w = 0;
  uint64_t clocks_event_reasons = 0;  // clocks_event bits
  int other_processes = 0;            // compute processes on the GPU other than this one
};

// The conditions of CUDA device `cuda_device` now (found by its PCI bus id).
GpuConditions read_gpu_conditions(int cuda_device);

// "sw power cap, hw thermal slowdown"; "none" for 0.
std::string clocks_event_names(uint64_t reasons);

// The conditions as named numbers, "gpu.<name>.<point>" (point: "start" or "end"); none where
// NVML was not available.
struct NamedValue {
  std::string name;
  double value;
};
std::vector<NamedValue> condition_values(const GpuConditions& c, const std::string& point);

}  // namespace fusekit::profiler
