// Writes a fusekit store with one synthetic run, for the CLI tests: two cases (baseline, fused)
// whose samples are drawn around given medians, and a small trace with nested ranges; with `steps`,
// instead a trace of training steps: each case's range holds two "rep" ranges, each a step >
// forward / backward whose backward kernels come from a second thread that opens no range (as
// PyTorch's autograd thread).
// Usage: make_test_store OUT.db BASELINE_MEDIAN_NS FUSED_MEDIAN_NS SEED [steps]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "store/store.h"

namespace {

using namespace fusekit;

profiler::RangeRecord range(const char* text, uint64_t start, uint64_t end) {
  profiler::RangeRecord r;
  r.start = start;
  r.end = end;
  r.process_id = 10;
  r.thread_id = 11;
  r.end_thread_id = 11;
  r.text = text;
  return r;
}

// Per case, two repetitions of a step: a GEMM in the forward, launched by the main thread (11); a
// LayerNorm backward in the backward, launched by a thread that holds no range (12).
profiler::Trace training_steps() {
  profiler::Trace t;
  t.process_id = 10;
  uint32_t correlation = 0;
  auto launch = [&](const char* name, uint64_t at, uint32_t thread, uint64_t duration) {
    profiler::ApiRecord a;
    a.start = at;
    a.end = at + 5;
    a.process_id = 10;
    a.thread_id = thread;
    a.correlation_id = ++correlation;
    a.name = "cudaLaunchKernel_v7000";
    t.api_calls.push_back(a);
    profiler::KernelRecord k;
    k.start = at + 10;
    k.end = k.start + duration;
    k.stream_id = 7;
    k.correlation_id = correlation;
    k.process_id = 10;
    k.name = name;
    t.kernels.push_back(k);
  };
  uint64_t at = 1000;
  for (const char* variant : {"baseline", "fused"}) {
    const uint64_t case_start = at;
    for (int rep = 0; rep < 2; ++rep) {
      t.ranges.push_back(range("rep", at, at + 2000));
      t.ranges.push_back(range("step", at, at + 2000));
      t.ranges.push_back(range("forward", at, at + 1000));
      t.ranges.push_back(range("backward", at + 1000, at + 2000));
      launch("nvjet_sm90_hsh_128x128_64x6_1x1_h_bz_NNT", at + 100, 11, 300);
      launch("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float, false>()",
             at + 1100, 12, std::string(variant) == "fused" ? 100 : 500);
      at += 2000;
    }
    t.ranges.push_back(range((std::string("demo/scale_add/1024/fp32 [") + variant + "]").c_str(), case_start, at));
    at += 1000;
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const bool steps = argc == 6 && std::string(argv[5]) == "steps";
  if (argc != 5 && !steps) {
    std::fprintf(stderr, "usage: make_test_store OUT.db BASELINE_NS FUSED_NS SEED [steps]\n");
    return 2;
  }
  try {
    store::Store store = store::Store::open(argv[1], store::Store::Mode::create);
    store::RunInfo info;
    info.label = "synthetic";
    info.command_line = "make_test_store";
    // A store may hold several runs (a history); these set what tells them apart.
    if (const char* gpu = std::getenv("MAKE_TEST_STORE_GPU")) info.gpu_name = gpu;
    if (const char* commit = std::getenv("MAKE_TEST_STORE_COMMIT")) info.git_commit = commit;
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
    if (steps) {
      store.append_trace(run, training_steps());
      store.finish_run(run, "ok", 0);
      return 0;
    }
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
