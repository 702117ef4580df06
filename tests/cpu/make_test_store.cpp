// Writes a fusekit store with one synthetic run, for the CLI tests: two cases (baseline, fused)
// whose samples are drawn around given medians, and a small trace with nested ranges.
// Usage: make_test_store OUT.db BASELINE_MEDIAN_NS FUSED_MEDIAN_NS SEED
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "store/store.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: make_test_store OUT.db BASELINE_NS FUSED_NS SEED\n");
    return 2;
  }
  using namespace fusekit;
  try {
    store::Store store = store::Store::open(argv[1], store::Store::Mode::create);
    store::RunInfo info;
    info.label = "synthetic";
    info.command_line = "make_test_store";
    const int64_t run = store.begin_run(info);
    std::mt19937 rng(static_cast<unsigned>(std::atoi(argv[4])));
    std::normal_distribution<double> noise(0.0, 0.01);
    for (const char* variant : {"baseline", "fused"}) {
      const double median = std::atof(std::string(variant) == "baseline" ? argv[2] : argv[3]);
      std::vector<double> samples;
      for (int i = 0; i < 30; ++i) samples.push_back(median * (1.0 + noise(rng)));
      store.add_case(run, {"demo/scale_add/1024/fp32", "scale_add", "1024", "fp32", variant, 8192, 2048}, samples);
    }
    profiler::Trace t;
    t.process_id = 10;
    profiler::RangeRecord outer;
    outer.start = 1000;
    outer.end = 9000;
    outer.process_id = 10;
    outer.thread_id = 11;
    outer.end_thread_id = 11;
    outer.text = "step";
    t.ranges.push_back(outer);
    for (uint32_t i = 0; i < 6; ++i) {
      profiler::ApiRecord a;
      a.start = 1100 + 1000 * i;
      a.end = a.start + 10;
      a.process_id = 10;
      a.thread_id = 11;
      a.correlation_id = i + 1;
      a.name = "cudaLaunchKernel_v7000";
      t.api_calls.push_back(a);
      profiler::KernelRecord k;
      k.start = a.start + 50;
      k.end = k.start + 300 + 100 * (i % 2);
      k.stream_id = 7;
      k.correlation_id = i + 1;
      k.process_id = 10;
      k.name = i % 2 ? "void fused_kernel<float>(float const*, float*)" : "scale_kernel";
      k.grid_x = 132;
      k.block_x = 256;
      t.kernels.push_back(k);
    }
    store.append_trace(run, t);
    store.set_copy_ceiling(run, 3.0e12);
    store.finish_run(run, "ok", 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_test_store: %s\n", e.what());
    return 1;
  }
  return 0;
}
