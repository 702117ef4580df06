// The HTML report's parts: the kernels of each case's traced range (autograd's threads included), the cases
// grouped by operator with their speedups, the grouped tables and the data of a page rendered from a
// hand-made store, and the history of a case over the runs of several stores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "posix_files.h"
#include "reports/case_groups.h"
#include "reports/case_kernels.h"
#include "reports/history.h"
#include "reports/html.h"
#include "reports/run_report.h"
#include "store/store.h"

namespace fusekit::reports {
namespace {

using test_support::TempDir;

// ---- a hand-made store

constexpr uint32_t kProcess = 10, kMain = 11, kAutograd = 12;

// Builds a trace bit by bit: ranges on the main thread, kernels launched by a given thread at a given time.
struct TraceBuilder {
  profiler::Trace trace;
  uint32_t correlation = 0;

  void range(const std::string& text, uint64_t start, uint64_t end, uint32_t thread = kMain) {
    profiler::RangeRecord r;
    r.start = start;
    r.end = end;
    r.process_id = kProcess;
    r.thread_id = thread;
    r.end_thread_id = thread;
    r.text = text;
    trace.ranges.push_back(r);
  }
  void kernel(const std::string& name, uint64_t launch, uint64_t duration, uint32_t thread = kMain) {
    profiler::ApiRecord a;
    a.start = launch;
    a.end = launch + 5;
    a.process_id = kProcess;
    a.thread_id = thread;
    a.correlation_id = ++correlation;
    a.name = "cudaLaunchKernel";
    trace.api_calls.push_back(a);
    profiler::KernelRecord k;
    k.start = launch + 10;
    k.end = k.start + duration;
    k.stream_id = 7;
    k.correlation_id = correlation;
    k.process_id = kProcess;
    k.name = name;
    trace.kernels.push_back(k);
  }
};

TEST(CaseKernels, CountsTheCaseRangeItsRepetitionsAndAutogradsThreads) {
  TraceBuilder b;
  // fused: two repetitions of one kernel each.
  b.range("op/1 [fused]", 1000, 2000);
  b.range("rep", 1100, 1400);
  b.kernel("fused_kernel", 1200, 100);
  b.range("rep", 1500, 1800);
  b.kernel("fused_kernel", 1600, 120);
  // baseline: the forward on the main thread, the backward launched by autograd's thread, no "rep" ranges.
  b.range("op/1 [baseline]", 3000, 4000);
  b.kernel("forward", 3100, 200);
  b.kernel("backward", 3500, 300, kAutograd);
  b.range("other thread's range", 3400, 3900, kAutograd);
  b.kernel("backward", 3600, 300, kAutograd);
  // Outside every case.
  b.kernel("setup", 5000, 50);
  b.kernel("setup", 5100, 50, kAutograd);
  const profiler::Attribution attribution = profiler::attribute(b.trace);
  const auto kernels = case_kernels(b.trace, attribution, {{"op/1", "fused"}, {"op/1", "baseline"}, {"op/2", "fused"}});
  ASSERT_EQ(kernels.size(), 2u);
  const VariantKernels& fused = kernels.at({"op/1", "fused"});
  EXPECT_EQ(fused.repetitions, 2u);
  EXPECT_EQ(fused.launches, 2u);
  EXPECT_EQ(fused.kernel_ns, 220u);
  ASSERT_EQ(fused.kernels.size(), 1u);
  EXPECT_EQ(fused.kernels[0].instances, 2u);
  const VariantKernels& baseline = kernels.at({"op/1", "baseline"});
  EXPECT_EQ(baseline.repetitions, 0u);
  EXPECT_EQ(baseline.launches, 3u);
  EXPECT_EQ(baseline.kernel_ns, 800u);
  ASSERT_EQ(baseline.kernels.size(), 2u);
  EXPECT_EQ(baseline.kernels[0].name, "backward");
  EXPECT_EQ(baseline.kernels[0].total_ns, 600u);
  EXPECT_EQ(baseline.kernels[1].name, "forward");
}

// Samples whose median, first and third quartiles are m, m - 1000, m + 1000 ns.
std::vector<double> samples(double median_ns) {
  return {median_ns - 2000, median_ns - 1000, median_ns, median_ns + 1000, median_ns + 2000};
}

struct HandMadeStore {
  TempDir dir{"fusekit_html_test_"};
  std::string path = dir.file("run.db");

  // One run; `scale` multiplies every median.
  int64_t add_run(const std::string& file, const std::string& commit, const std::string& started, double scale,
                  const std::string& gpu = "NVIDIA H100 80GB HBM3") {
    store::Store s = store::Store::open(file, store::Store::Mode::create);
    store::RunInfo info;
    info.command_line = "fusekit bench --suite ops";
    info.git_commit = commit;
    info.started_at = started;
    info.gpu_name = gpu;
    const int64_t run = s.begin_run(info);
    s.set_copy_ceiling(run, 1e12);
    const auto add = [&](const std::string& name, const std::string& op, const std::string& variant, double us,
                         double bytes, double flops) {
      s.add_case(run, {name, op, name.substr(name.find('/') + 1), "fp16", variant, bytes, flops},
                 samples(us * 1e3 * scale));
    };
    add("layernorm/8192x768/fp16/fwd", "layernorm", "fused", 12, 6e6, 0);
    add("layernorm/8192x768/fp16/fwd", "layernorm", "baseline", 22, 6e6, 0);
    add("layernorm/8192x768/fp16/fwd", "layernorm", "peer:eager", 32, 6e6, 0);
    add("layernorm/8192x768/fp16/fwd", "layernorm", "peer:compile", 17, 6e6, 0);
    add("layernorm/16384x1024/fp16/fwd", "layernorm", "fused", 20, 0, 0);
    add("layernorm/16384x1024/fp16/fwd", "layernorm", "baseline", 40, 0, 0);
    add("layernorm/16384x1024/fp16/fwd", "layernorm", "peer:eager", 38, 0, 0);
    add("linear/64x64/fp16/fwd", "linear", "fused", 5, 0, 5e6);
    add("linear/64x64/fp16/fwd", "linear", "baseline", 10, 0, 5e6);
    add("linear/64x64/fp16/fwd", "linear", "reference:copy", 4, 0, 0);
    TraceBuilder b;
    b.range("layernorm/8192x768/fp16/fwd [fused]", 1000, 2000);
    for (int r = 0; r < 3; ++r) {
      b.range("rep", 1100 + 300 * r, 1300 + 300 * r);
      b.kernel("void ns::layernorm_forward_kernel<__half, 8, 3, 32, false>(__half const*)", 1150 + 300 * r, 100);
    }
    b.range("layernorm/8192x768/fp16/fwd [baseline]", 3000, 4000);
    b.kernel("void at::native::vectorized_layer_norm_kernel<c10::Half, float>(int)", 3100, 300);
    b.kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)", 3200, 100);
    b.range("layernorm/8192x768/fp16/fwd [peer:eager]", 5000, 6000);
    b.kernel("void at::native::vectorized_layer_norm_kernel<c10::Half, float>(int)", 5100, 300);
    b.kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int> >(int)", 5200, 100);
    b.range("layernorm/16384x1024/fp16/fwd [fused]", 7000, 8000);
    b.kernel("void ns::layernorm_forward_kernel<__half, 8, 4, 32, false>(__half const*)", 7100, 200);
    s.append_trace(run, b.trace);
    s.finish_run(run, "ok", 0);
    return run;
  }
};

TEST(CaseGroups, OneRowPerCaseWithTheSpeedupsOverTheBaselineAndTheBestOther) {
  HandMadeStore h;
  const int64_t run = h.add_run(h.path, "aaaaaaa", "2026-01-01T00:00:00Z", 1);
  const store::Store s = store::Store::open(h.path, store::Store::Mode::read_only);
  const std::vector<CaseResult> cases = load_case_results(s, run);
  const std::vector<OperatorGroup> groups = group_by_operator(cases);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].op, "layernorm");
  EXPECT_EQ(groups[0].variants, (std::vector<std::string>{"fused", "baseline", "peer:eager", "peer:compile"}));
  ASSERT_EQ(groups[0].rows.size(), 2u);
  const CaseRow& first = groups[0].rows[0];
  EXPECT_EQ(first.label, "8192x768/fp16/fwd");
  EXPECT_DOUBLE_EQ(*first.vs_baseline, 22.0 / 12);
  EXPECT_EQ(first.best_other, "peer:compile");
  EXPECT_DOUBLE_EQ(*first.vs_best_other, 17.0 / 12);
  EXPECT_DOUBLE_EQ(*first.fused->bandwidth_percent, 50.0);  // 6 MB in 12 us of a 1 TB/s ceiling
  const CaseRow& second = groups[0].rows[1];
  EXPECT_EQ(second.best_other, "peer:eager");
  EXPECT_DOUBLE_EQ(*second.vs_baseline, 2.0);
  EXPECT_DOUBLE_EQ(*second.vs_best_other, 38.0 / 20);
  // A reference variant is a column, not a competitor.
  EXPECT_EQ(groups[1].variants, (std::vector<std::string>{"fused", "baseline", "reference:copy"}));
  EXPECT_EQ(groups[1].rows[0].best_other, "baseline");
  EXPECT_DOUBLE_EQ(*groups[1].rows[0].vs_best_other, 2.0);
}

// The cells of the first table after `marker`: per row, per cell, its data-v (or its text where it has none).
std::vector<std::vector<std::string>> table_cells(const std::string& html, const std::string& marker) {
  const size_t begin = html.find("<tbody>", html.find(marker));
  const size_t end = html.find("</tbody>", begin);
  std::vector<std::vector<std::string>> rows;
  for (size_t tr = html.find("<tr>", begin); tr < end; tr = html.find("<tr>", tr + 1)) {
    const size_t tr_end = html.find("</tr>", tr);
    std::vector<std::string> cells;
    for (size_t td = html.find("<td", tr); td < tr_end; td = html.find("<td", td + 1)) {
      const size_t open_end = html.find('>', td);
      const std::string open = html.substr(td, open_end - td);
      const size_t v = open.find("data-v=\"");
      if (v != std::string::npos) {
        cells.push_back(open.substr(v + 8, open.find('"', v + 8) - (v + 8)));
      } else {
        std::string text = html.substr(open_end + 1, html.find("</td>", open_end) - open_end - 1);
        cells.push_back(text);
      }
    }
    rows.push_back(cells);
  }
  return rows;
}

TEST(HtmlReport, GroupedTablesHoldTheStoresNumbers) {
  HandMadeStore h;
  const int64_t run = h.add_run(h.path, "aaaaaaa", "2026-01-01T00:00:00Z", 1);
  const store::Store s = store::Store::open(h.path, store::Store::Mode::read_only);
  const RunReport report = load_run_report(s, run);
  const std::string html = report_html(report);

  // The operators' table: cases, geometric means of the speedups, fastest counts.
  const auto overview = table_cells(html, "<h2>Operators</h2>");
  ASSERT_EQ(overview.size(), 2u);
  EXPECT_NE(overview[0][0].find("href=\"#op-0\">layernorm</a>"), std::string::npos);
  EXPECT_EQ(overview[0][1], "2");
  EXPECT_NEAR(std::stod(overview[0][2]), std::sqrt(22.0 / 12 * 2.0), 1e-12);
  EXPECT_NEAR(std::stod(overview[0][3]), std::sqrt(17.0 / 12 * 38.0 / 20), 1e-12);
  EXPECT_EQ(overview[0][4], "1");  // fused fastest in 2 of 2

  // layernorm: case, fused, baseline, peer:eager, peer:compile (us), vs baseline, vs best other, % of ceiling.
  const auto layernorm = table_cells(html, "<section id=\"op-0\">");
  ASSERT_EQ(layernorm.size(), 2u);
  ASSERT_EQ(layernorm[0].size(), 8u);
  EXPECT_NE(layernorm[0][0].find("href=\"#case-0\""), std::string::npos);
  EXPECT_NE(layernorm[0][0].find(">8192x768/fp16/fwd</a>"), std::string::npos);
  EXPECT_EQ(layernorm[0][1], "12");
  EXPECT_EQ(layernorm[0][2], "22");
  EXPECT_EQ(layernorm[0][3], "32");
  EXPECT_EQ(layernorm[0][4], "17");
  EXPECT_NEAR(std::stod(layernorm[0][5]), 22.0 / 12, 1e-12);
  EXPECT_NEAR(std::stod(layernorm[0][6]), 17.0 / 12, 1e-12);
  EXPECT_EQ(layernorm[0][7], "50");
  EXPECT_EQ(layernorm[1][4], "");  // no peer:compile for the second case: an empty cell that sorts last
  EXPECT_NE(html.find(">12.00<small>11.00–13.00</small></td>"), std::string::npos);   // median, Q1–Q3
  EXPECT_NE(html.find(">1.42x<small>peer:compile</small></td>"), std::string::npos);  // which is the best other
  // linear: TFLOP/s, and the reference's column.
  const auto linear = table_cells(html, "<section id=\"op-1\">");
  ASSERT_EQ(linear.size(), 1u);
  ASSERT_EQ(linear[0].size(), 7u);  // case, fused, baseline, reference:copy, vs baseline, vs best other, TFLOP/s
  EXPECT_EQ(linear[0][3], "4");
  EXPECT_NEAR(std::stod(linear[0][6]), 1.0, 1e-12);  // 5 MFLOP in 5 us
  // A chart per operator, the kernel blocks of the traced cases, and none for an untraced one.
  EXPECT_NE(html.find("<canvas id=\"speedup-0\">"), std::string::npos);
  EXPECT_NE(html.find("<canvas id=\"speedup-1\">"), std::string::npos);
  EXPECT_EQ(html.find("<canvas id=\"history-"), std::string::npos);
  EXPECT_NE(html.find("<details class=\"case\" id=\"case-0\" data-case=\"0\">"), std::string::npos);
  EXPECT_NE(html.find("kernels a repetition: fused 1; kernels in the traced range: baseline 2, peer:eager 2"),
            std::string::npos);
  EXPECT_EQ(html.find("id=\"case-2\""), std::string::npos);
  EXPECT_NE(html.find("1 case has no traced kernels in this run."), std::string::npos);
}

TEST(HtmlReport, EachKernelIsNamedOnceWithALabelToldApartInTheWholeRun) {
  HandMadeStore h;
  const int64_t run = h.add_run(h.path, "aaaaaaa", "2026-01-01T00:00:00Z", 1);
  const store::Store s = store::Store::open(h.path, store::Store::Mode::read_only);
  const RunReport report = load_run_report(s, run);
  const VariantKernels& baseline = report.case_kernels.at({"layernorm/8192x768/fp16/fwd", "baseline"});
  EXPECT_EQ(baseline.launches, 2u);
  EXPECT_EQ(baseline.kernel_ns, 400u);
  const std::string html = report_html(report);
  // The names table names each kernel once, with its label.
  for (const char* label :
       {"\"short\":\"layernorm_forward_kernel<3>\"", "\"short\":\"layernorm_forward_kernel<4>\"",
        "\"short\":\"vectorized_layer_norm_kernel\"", "\"short\":\"vectorized_elementwise_kernel<float>\"",
        "\"short\":\"vectorized_elementwise_kernel<int>\""}) {
    size_t n = 0;
    for (size_t at = html.find(label); at != std::string::npos; at = html.find(label, at + 1)) ++n;
    EXPECT_EQ(n, 1u) << label;
  }
}

TEST(History, MediansOverTheRunsOfSeveralStoresOnTheSameGpu) {
  HandMadeStore h;
  const std::string other = h.dir.file("older.db");
  h.add_run(other, "ccccccc", "2026-01-01T00:00:00Z", 1.5);
  h.add_run(h.path, "aaaaaaa", "2026-01-02T00:00:00Z", 1.25);
  h.add_run(h.path, "ddddddd", "2026-01-02T12:00:00Z", 9, "another GPU");
  const int64_t current = h.add_run(h.path, "bbbbbbb", "2026-01-03T00:00:00Z", 1);
  const store::Store a = store::Store::open(h.path, store::Store::Mode::read_only);
  const store::Store b = store::Store::open(other, store::Store::Mode::read_only);
  const RunReport report = load_run_report(a, current);
  // The current store given twice counts once.
  const History history = load_history({&a, &b, &a}, report.run, report.cases);
  ASSERT_EQ(history.runs.size(), 3u);
  EXPECT_EQ(history.runs[0].run.git_commit, "ccccccc");
  EXPECT_EQ(history.runs[0].store, other);
  EXPECT_EQ(history.runs[1].run.git_commit, "aaaaaaa");
  EXPECT_TRUE(history.runs[2].current);
  EXPECT_EQ(history.runs[2].store, h.path);
  const CaseKey key{"layernorm/8192x768/fp16/fwd", "fused"};
  EXPECT_DOUBLE_EQ(history.runs[0].cases.at(key).median_ns, 18000);
  EXPECT_DOUBLE_EQ(history.runs[1].cases.at(key).median_ns, 15000);
  EXPECT_DOUBLE_EQ(history.runs[2].cases.at(key).median_ns, 12000);
  EXPECT_DOUBLE_EQ(history.runs[2].cases.at(key).q3_ns, 13000);

  const std::string html = report_html(report, history);
  EXPECT_NE(html.find("<canvas id=\"history-0\">"), std::string::npos);
  EXPECT_NE(html.find("<canvas id=\"history-1\">"), std::string::npos);
  EXPECT_NE(html.find("<option value=\"fused\" selected>fused</option>"), std::string::npos);
  EXPECT_NE(html.find("\"label\":\"ccccccc 01-01 00:00\""), std::string::npos);
  EXPECT_NE(html.find("\"fused\":[18,15,12]"), std::string::npos);
  EXPECT_NE(html.find("The runs in the history charts: 3"), std::string::npos);

  // One run is no history.
  const History alone = load_history({&a}, report.run, {});
  ASSERT_EQ(alone.runs.size(), 1u);  // the current run: no other shares a case with none
  EXPECT_EQ(report_html(report, alone).find("<canvas id=\"history-"), std::string::npos);
}

}  // namespace
}  // namespace fusekit::reports
