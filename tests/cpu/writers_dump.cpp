// Writes a sample report (names with commas, quotes, pipes, templates and "</script>"; two cases, one with
// its traced kernels) as report.html, cases.csv, kernels.csv and trace.json into the directory argv[1], for
// check_writers.py to read with Python's own parsers (and a browser, where one is installed).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "reports/chrome_trace.h"
#include "reports/csv.h"
#include "reports/html.h"

namespace {

using namespace fusekit;

constexpr uint64_t kOrigin = 1'700'000'000'000'000'000ull;
const char* const kEvilKernel = "evil</script><script>alert('x')</script>&\"<!--<script>";

reports::RunReport sample_report() {
  reports::RunReport r;
  r.run.id = 1;
  r.run.label = "sample, \"dump\"";
  r.run.command_line = "fusekit run --suite ops | tee log.txt";
  r.run.git_commit = "0123456789abcdef0123456789abcdef01234567";
  r.run.gpu_name = "NVIDIA H100 80GB HBM3";
  r.run.status = "ok";
  r.run.copy_ceiling_bytes_per_second = 3.01e12;
  const auto add_case = [&](const std::string& name, const std::string& variant, double median_ns,
                            std::optional<double> speedup) {
    reports::CaseResult c;
    c.info = {name, "layernorm", "8192x768", "fp16", variant, 25165824, 0};
    c.samples_ns = {median_ns * 0.98, median_ns, median_ns * 1.05};
    c.median_ns = median_ns;
    c.q1_ns = c.min_ns = c.samples_ns[0];
    c.q3_ns = c.max_ns = c.samples_ns[2];
    c.speedup = speedup;
    c.bandwidth_bytes_per_s = c.info.bytes / (median_ns * 1e-9);
    c.bandwidth_percent = 100 * *c.bandwidth_bytes_per_s / r.run.copy_ceiling_bytes_per_second;
    r.cases.push_back(c);
  };
  add_case("layernorm/8192x768/fp16/fwd", "baseline", 25000, 1.0);
  add_case("layernorm/8192x768/fp16/fwd", "fused", 10000, 2.5);
  add_case("attn, \"windowed\" 7x7 | mask", "baseline", 1.2e6, 1.0);
  add_case("attn, \"windowed\" 7x7 | mask", "peer:compile", 0.9e6, std::nullopt);
  const char* const names[] = {"void f<int, 2>(float*)", kEvilKernel, "with, comma \"and quote\"", "a|b"};
  for (int i = 0; i < 24; ++i) {
    profiler::KernelStats k;
    k.name = i < 4 ? names[i] : "kernel_" + std::to_string(i);
    k.instances = 10;
    k.total_ns = 100000 - 1000 * i;
    k.time_percent = 100.0 / 24;
    k.avg_ns = k.med_ns = k.total_ns / 10.0;
    k.min_ns = k.max_ns = k.total_ns / 10;
    r.kernels.push_back(k);
  }
  r.ranges = {{"train_step", 10, 5000000, 4000000, 30, 4500000, 0.2}};
  // The traced kernels of two variants of the first case, for the case's kernel block.
  reports::VariantKernels fused, baseline;
  fused.kernel_ns = 30000;
  fused.launches = 3;
  fused.repetitions = 3;
  fused.kernels = {{kEvilKernel, 30000, 3}};
  baseline.kernel_ns = 75000;
  baseline.launches = 9;
  baseline.kernels = {{names[0], 50000, 6}, {names[2], 25000, 3}};
  r.case_kernels[{"layernorm/8192x768/fp16/fwd", "fused"}] = fused;
  r.case_kernels[{"layernorm/8192x768/fp16/fwd", "baseline"}] = baseline;
  return r;
}

profiler::Trace sample_trace() {
  profiler::Trace t;
  t.process_id = 4242;
  for (uint32_t i = 0; i < 4; ++i) {
    profiler::KernelRecord k;
    k.start = kOrigin + 1000 * i + 100;
    k.end = k.start + 800;
    k.stream_id = 7 + i % 2;
    k.correlation_id = 10 + i;
    k.process_id = 4242;
    k.name = i == 1 ? kEvilKernel : "void f<int, 2>(float*)";
    t.kernels.push_back(k);
    t.api_calls.push_back({kOrigin + 1000 * i, kOrigin + 1000 * i + 50, 4242, 100, 10 + i, 1,
                           profiler::ApiKind::runtime, 0, "cudaLaunchKernel"});
  }
  t.memcpys.push_back({kOrigin + 5000, kOrigin + 6000, 0, 1, 7, 20, 4242, 4096, 1, 0, 3});
  t.memsets.push_back({kOrigin + 6000, kOrigin + 6100, 0, 1, 7, 21, 4242, 4096, 0});
  t.ranges.push_back({kOrigin, kOrigin + 7000, 4242, 100, 100, profiler::kNvtxPushPopRange, "step", ""});
  t.ranges.push_back({kOrigin + 10, 0, 4242, 100, 100, profiler::kNvtxPushPopRange, "never closed", ""});
  return t;
}

bool write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) std::cerr << "writers_dump: cannot write " << path << "\n";
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: writers_dump <directory>\n";
    return 2;
  }
  const std::string dir = argv[1];
  const reports::RunReport report = sample_report();
  const bool ok = write(dir + "/report.html", reports::report_html(report)) &&
                  write(dir + "/cases.csv", reports::cases_csv(report)) &&
                  write(dir + "/kernels.csv", reports::kernels_csv(report)) &&
                  write(dir + "/trace.json", reports::chrome_trace_json(sample_trace(), report.run));
  return ok ? 0 : 1;
}
