// The GPU conditions reader (profiler/gpu_conditions.h) where this test runs (CI: no driver, so NVML
// is not found and the reader says so; a GPU machine: real clocks), the names of the throttle
// reasons, and the named values the runner stores with each case.
#include <gtest/gtest.h>

#include "profiler/gpu_conditions.h"

namespace fusekit::profiler {
namespace {

TEST(GpuConditions, ReadsOrSaysWhyNot) {
  const GpuConditions c = read_gpu_conditions(0);
  if (!c.available) {
    EXPECT_FALSE(c.error.empty());
    EXPECT_TRUE(condition_values(c, "start").empty());
    return;
  }
  EXPECT_GT(c.sm_clock_mhz, 0);
  EXPECT_GT(c.memory_clock_mhz, 0);
  EXPECT_GT(c.temperature_c, 0);
  EXPECT_GT(c.power_w, 0);
  EXPECT_GE(c.other_processes, -1);
}

TEST(GpuConditions, ReasonNames) {
  EXPECT_EQ(clocks_event_names(0), "none");
  EXPECT_EQ(clocks_event_names(clocks_event::sw_power_cap | clocks_event::hw_thermal_slowdown),
            "sw power cap, hw thermal slowdown");
  EXPECT_EQ(clocks_event_names(clocks_event::gpu_idle | 0x10000), "gpu idle, other");
  EXPECT_EQ(clocks_event::throttling & (clocks_event::gpu_idle | clocks_event::applications_clocks_setting), 0u);
}

TEST(GpuConditions, NamedValues) {
  GpuConditions c;
  c.available = true;
  c.sm_clock_mhz = 1980;
  c.memory_clock_mhz = 2619;
  c.temperature_c = 41;
  c.power_w = 312.5;
  c.clocks_event_reasons = clocks_event::sw_power_cap;
  c.other_processes = 0;
  const std::vector<NamedValue> v = condition_values(c, "end");
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(v[0].name, "gpu.sm_clock_mhz.end");
  EXPECT_EQ(v[0].value, 1980);
  EXPECT_EQ(v[4].name, "gpu.clocks_event_reasons.end");
  EXPECT_EQ(v[4].value, 4);
  EXPECT_EQ(v[5].name, "gpu.other_processes.end");
  c.other_processes = -1;  // unknown: not stored
  EXPECT_EQ(condition_values(c, "end").size(), 5u);
}

}  // namespace
}  // namespace fusekit::profiler
