// Measures what tracing costs per kernel launch: host time to launch N empty kernels and wait
// for them, with the tracer off and on (median of several trials, in one process), plus the time
// to flush and convert the records afterwards. Prints a table; the README quotes it.
#include <chrono>
#include <cstdio>
#include <vector>

#include "profiler/cupti_tracer.h"
#include "profiler/environment.h"
#include "profiler/summary.h"

__global__ void empty_kernel() {}

namespace {

double launch_ns(int launches) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) empty_kernel<<<1, 32>>>();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main() {
  using namespace fusekit::profiler;
  if (std::string reason = gpu_unavailable_reason(); !reason.empty()) {
    std::printf("trace_overhead: no GPU: %s\n", reason.c_str());
    return 1;
  }
  constexpr int kLaunches = 20'000, kTrials = 7;
  launch_ns(kLaunches);  // warm-up: module load, context
  CuptiTracer& tracer = CuptiTracer::instance();
  std::vector<double> off, on, flush;
  size_t recorded = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    off.push_back(launch_ns(kLaunches) / kLaunches);
    tracer.start();
    on.push_back(launch_ns(kLaunches) / kLaunches);
    tracer.stop();
    const auto start = std::chrono::steady_clock::now();
    Trace t = tracer.flush(true);
    flush.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
                    kLaunches);
    recorded = t.kernels.size();
  }
  const double m_off = median(off), m_on = median(on), m_flush = median(flush);
  std::printf("tracing overhead, %d launches of an empty kernel, median of %d trials:\n", kLaunches, kTrials);
  std::printf("  launch+wait per kernel, tracer off : %8.0f ns\n", m_off);
  std::printf("  launch+wait per kernel, tracer on  : %8.0f ns\n", m_on);
  std::printf("  added per launch                   : %8.0f ns\n", m_on - m_off);
  std::printf("  flush and convert, per kernel      : %8.0f ns\n", m_flush);
  std::printf("  kernels recorded in last trial     : %zu\n", recorded);
  return recorded == kLaunches ? 0 : 1;
}
