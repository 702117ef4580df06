#include "profiler/gpu_conditions.h"

#include <utility>

namespace fusekit::profiler {

std::string clocks_event_names(uint64_t reasons) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {clocks_event::gpu_idle, "gpu idle"},
      {clocks_event::applications_clocks_setting, "applications clocks setting"},
      {clocks_event::sw_power_cap, "sw power cap"},
      {clocks_event::hw_slowdown, "hw slowdown"},
      {clocks_event::sync_boost, "sync boost"},
      {clocks_event::sw_thermal_slowdown, "sw thermal slowdown"},
      {clocks_event::hw_thermal_slowdown, "hw thermal slowdown"},
      {clocks_event::hw_power_brake_slowdown, "hw power brake slowdown"},
      {clocks_event::display_clock_setting, "display clock setting"},
  };
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if (reasons & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  }
  const uint64_t known = 0x1ff;
  if (reasons & ~known) out += (out.empty() ? "" : ", ") + std::string("other");
  return out.empty() ? "none" : out;
}

std::vector<NamedValue> condition_values(const GpuConditions& c, const std::string& point) {
  if (!c.available) return {};
  std::vector<NamedValue> v = {
      {"gpu.sm_clock_mhz." + point, c.sm_clock_mhz},
      {"gpu.memory_clock_mhz." + point, c.memory_clock_mhz},
      {"gpu.temperature_c." + point, c.temperature_c},
      {"gpu.power_w." + point, c.power_w},
      {"gpu.clocks_event_reasons." + point, static_cast<double>(c.clocks_event_reasons)},
  };
  if (c.other_processes >= 0) v.push_back({"gpu.other_processes." + point, static_cast<double>(c.other_processes)});
  return v;
}

}  // namespace fusekit::profiler
