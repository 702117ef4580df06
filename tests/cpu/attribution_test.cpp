// Attribution and summaries from synthetic records: nested ranges, several streams, overlapping
// kernels, a range without kernels, kernels launched outside every range, two threads; the
// projection of launches from threads without ranges (PyTorch's autograd thread) by time; the
// breakdown of a case's repetitions by kernel category and nested range.
#include <gtest/gtest.h>

#include "profiler/attribution.h"
#include "profiler/summary.h"

namespace fusekit::profiler {
namespace {

constexpr uint32_t kPid = 100;

RangeRecord range(const char* text, uint64_t start, uint64_t end, uint32_t tid) {
  RangeRecord r;
  r.start = start;
  r.end = end;
  r.process_id = kPid;
  r.thread_id = tid;
  r.end_thread_id = tid;
  r.text = text;
  return r;
}

// A launch call at `launch_time` on thread `tid` whose kernel runs [start, end) on `stream`.
void launch(Trace& t, const char* name, uint64_t launch_time, uint32_t tid, uint64_t start, uint64_t end,
            uint32_t stream = 7) {
  const uint32_t correlation = static_cast<uint32_t>(t.api_calls.size() + 1);
  ApiRecord a;
  a.start = launch_time;
  a.end = launch_time + 2;
  a.process_id = kPid;
  a.thread_id = tid;
  a.correlation_id = correlation;
  a.name = "cudaLaunchKernel";
  t.api_calls.push_back(a);
  KernelRecord k;
  k.start = start;
  k.end = end;
  k.stream_id = stream;
  k.correlation_id = correlation;
  k.process_id = kPid;
  k.name = name;
  t.kernels.push_back(k);
}

int index_of(const Trace& t, const std::string& text) {
  for (size_t i = 0; i < t.ranges.size(); ++i) {
    if (t.ranges[i].text == text) return static_cast<int>(i);
  }
  return kNoRange;
}

std::string range_of_kernel(const Trace& t, const Attribution& a, size_t kernel) {
  return a.kernel_range[kernel] == kNoRange ? "<none>" : t.ranges[a.kernel_range[kernel]].text;
}

TEST(Attribution, InnermostRangeOnTheLaunchingThread) {
  Trace t;
  t.ranges.push_back(range("outer", 100, 1000, 1));
  t.ranges.push_back(range("inner", 200, 400, 1));
  t.ranges.push_back(range("empty", 500, 600, 1));
  t.ranges.push_back(range("other-thread", 0, 5000, 2));
  launch(t, "a", 150, 1, 160, 170);     // outer only
  launch(t, "b", 250, 1, 300, 310);     // inner
  launch(t, "c", 399, 1, 450, 460);     // inner: launched before inner closed, ran after
  launch(t, "d", 400, 1, 470, 480);     // outer: inner is half-open, closed at 400
  launch(t, "e", 1500, 1, 1600, 1700);  // outside every range of thread 1
  launch(t, "f", 250, 2, 260, 270);     // thread 2's range, though thread 1's inner is open then
  const Attribution a = attribute(t);
  EXPECT_EQ(range_of_kernel(t, a, 0), "outer");
  EXPECT_EQ(range_of_kernel(t, a, 1), "inner");
  EXPECT_EQ(range_of_kernel(t, a, 2), "inner");
  EXPECT_EQ(range_of_kernel(t, a, 3), "outer");
  EXPECT_EQ(range_of_kernel(t, a, 4), "<none>");
  EXPECT_EQ(range_of_kernel(t, a, 5), "other-thread");
  EXPECT_EQ(a.range_parent[index_of(t, "inner")], index_of(t, "outer"));
  EXPECT_EQ(a.range_parent[index_of(t, "empty")], index_of(t, "outer"));
  EXPECT_EQ(a.range_parent[index_of(t, "outer")], kNoRange);
  EXPECT_EQ(a.range_parent[index_of(t, "other-thread")], kNoRange);
  EXPECT_TRUE(range_within(a, index_of(t, "inner"), index_of(t, "outer")));
  EXPECT_FALSE(range_within(a, index_of(t, "outer"), index_of(t, "inner")));
  EXPECT_EQ(a.kernels_without_api_record, 0u);
}

TEST(Attribution, KernelWithoutLaunchRecordAndUnclosedRange) {
  Trace t;
  t.ranges.push_back(range("never-closed", 100, 0, 1));
  launch(t, "a", 200, 1, 300, 400);
  KernelRecord orphan;
  orphan.correlation_id = 999;
  orphan.start = 10;
  orphan.end = 20;
  orphan.name = "orphan";
  t.kernels.push_back(orphan);
  const Attribution a = attribute(t);
  EXPECT_EQ(range_of_kernel(t, a, 0), "never-closed");
  EXPECT_EQ(a.kernel_range[1], kNoRange);
  EXPECT_EQ(a.kernels_without_api_record, 1u);
}

TEST(Attribution, CopiesAndMemsetsFollowTheirCalls) {
  Trace t;
  t.ranges.push_back(range("copy-range", 0, 100, 3));
  ApiRecord call;
  call.start = 50;
  call.process_id = kPid;
  call.thread_id = 3;
  call.correlation_id = 42;
  t.api_calls.push_back(call);
  MemcpyRecord m;
  m.correlation_id = 42;
  m.process_id = kPid;
  m.bytes = 4096;
  t.memcpys.push_back(m);
  MemsetRecord s;
  s.correlation_id = 43;  // no call recorded
  s.process_id = kPid;
  t.memsets.push_back(s);
  const Attribution a = attribute(t);
  EXPECT_EQ(a.memcpy_range[0], 0);
  EXPECT_EQ(a.memset_range[0], kNoRange);
}

TEST(Summary, UnionOfOverlappingIntervals) {
  EXPECT_EQ(union_length({}), 0u);
  EXPECT_EQ(union_length({{0, 10}, {5, 15}, {20, 30}, {25, 26}}), 25u);
  EXPECT_EQ(union_length({{20, 30}, {0, 10}, {10, 20}}), 30u);
  EXPECT_EQ(union_length({{5, 5}, {7, 3}}), 0u);
}

TEST(Summary, KernelTableMatchesNsysColumns) {
  Trace t;
  t.ranges.push_back(range("step", 0, 10000, 1));
  launch(t, "void gemm<float>(float*)", 10, 1, 100, 200);  // 100
  launch(t, "void gemm<float>(float*)", 20, 1, 200, 500);  // 300
  launch(t, "void gemm<float>(float*)", 30, 1, 500, 700);  // 200
  launch(t, "relu", 40, 1, 700, 1100);                     // 400
  launch(t, "outside", 20000, 1, 20000, 20100);            // 100, no range
  const Attribution a = attribute(t);
  const auto all = summarize_kernels(t, a);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].name, "void gemm<float>(float*)");
  EXPECT_EQ(all[0].total_ns, 600u);
  EXPECT_EQ(all[0].instances, 3u);
  EXPECT_DOUBLE_EQ(all[0].avg_ns, 200.0);
  EXPECT_DOUBLE_EQ(all[0].med_ns, 200.0);
  EXPECT_EQ(all[0].min_ns, 100u);
  EXPECT_EQ(all[0].max_ns, 300u);
  EXPECT_DOUBLE_EQ(all[0].stddev_ns, 100.0);  // sample standard deviation of 100, 300, 200
  EXPECT_NEAR(all[0].time_percent, 600.0 / 1100.0 * 100.0, 1e-9);
  EXPECT_EQ(all[1].name, "relu");
  EXPECT_EQ(all[2].stddev_ns, 0.0);

  const auto in_step = summarize_kernels(t, a, std::string("step"));
  ASSERT_EQ(in_step.size(), 2u);
  EXPECT_NEAR(in_step[0].time_percent + in_step[1].time_percent, 100.0, 1e-9);

  const auto short_names = summarize_kernels(t, a, std::nullopt, true);
  EXPECT_EQ(short_names[0].name, "gemm");
}

TEST(Summary, RangesCountBusyTimeOnceAcrossStreams) {
  Trace t;
  t.ranges.push_back(range("step", 0, 1000, 1));
  t.ranges.push_back(range("forward", 10, 500, 1));
  t.ranges.push_back(range("idle-range", 600, 700, 1));
  launch(t, "k1", 20, 1, 100, 300, /*stream=*/7);
  launch(t, "k2", 30, 1, 200, 400, /*stream=*/8);   // overlaps k1 on another stream
  launch(t, "k3", 550, 1, 800, 900, /*stream=*/7);  // in step, not in forward
  const Attribution a = attribute(t);
  const auto ranges = summarize_ranges(t, a);
  auto find = [&](const std::string& name) {
    for (const auto& r : ranges) {
      if (r.name == name) return r;
    }
    ADD_FAILURE() << "no range " << name;
    return RangeStats{};
  };
  const RangeStats step = find("step");
  EXPECT_EQ(step.wall_ns, 1000u);
  EXPECT_EQ(step.busy_ns, 300u + 100u);  // [100,400) once, plus [800,900)
  EXPECT_EQ(step.kernel_ns, 200u + 200u + 100u);
  EXPECT_EQ(step.kernels, 3u);
  EXPECT_NEAR(step.idle_fraction, 0.6, 1e-12);
  const RangeStats forward = find("forward");
  EXPECT_EQ(forward.busy_ns, 300u);
  EXPECT_EQ(forward.kernels, 2u);
  const RangeStats idle = find("idle-range");
  EXPECT_EQ(idle.kernels, 0u);
  EXPECT_EQ(idle.busy_ns, 0u);
  EXPECT_DOUBLE_EQ(idle.idle_fraction, 1.0);

  const RunTotals totals = summarize_run(t);
  EXPECT_EQ(totals.kernels, 3u);
  EXPECT_EQ(totals.busy_ns, 400u);
  EXPECT_EQ(totals.wall_ns, 990u);  // from 10: CUPTI writes 0 for an unknown time, so 0 is ignored
}

TEST(Summary, IdleFractionCoversKernelsThatRunAfterTheRangeCloses) {
  Trace t;
  t.ranges.push_back(range("async", 0, 100, 1));
  launch(t, "late", 10, 1, 200, 300);  // launched inside, runs after the range closed
  const auto ranges = summarize_ranges(t, attribute(t));
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].wall_ns, 100u);
  EXPECT_EQ(ranges[0].extent_ns, 300u);
  EXPECT_EQ(ranges[0].busy_ns, 100u);
  EXPECT_NEAR(ranges[0].idle_fraction, 1.0 - 100.0 / 300.0, 1e-12);
}

TEST(Summary, RepeatedRangeNamesAggregate) {
  Trace t;
  for (uint64_t i = 0; i < 4; ++i) {
    t.ranges.push_back(range("rep", i * 100, i * 100 + 50, 1));
    launch(t, "k", i * 100 + 1, 1, i * 100 + 10, i * 100 + 30);
  }
  const auto ranges = summarize_ranges(t, attribute(t));
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].instances, 4u);
  EXPECT_EQ(ranges[0].wall_ns, 200u);
  EXPECT_EQ(ranges[0].busy_ns, 80u);
}

TEST(Names, ShortKernelNames) {
  EXPECT_EQ(short_kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                              "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"),
            "vectorized_elementwise_kernel");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"),
            "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32");
  EXPECT_EQ(short_kernel_name("void (anonymous namespace)::scale_kernel(float const*, float*, float, unsigned long)"),
            "scale_kernel");
  EXPECT_EQ(demangle("_Z3addPfS_i"), "add(float*, float*, int)");
  EXPECT_EQ(demangle("not_mangled"), "not_mangled");
}

}  // namespace
}  // namespace fusekit::profiler

namespace fusekit::profiler {
namespace {

// Two processes in one run number their correlation ids independently: a kernel belongs to the
// launch call of its own process with that id.
TEST(Attribution, CorrelationIdsArePerProcess) {
  Trace t;
  for (uint32_t pid : {100u, 200u}) {
    RangeRecord r = range(pid == 100 ? "in-100" : "in-200", 0, 1000, 1);
    r.process_id = pid;
    t.ranges.push_back(r);
    ApiRecord a;
    a.start = 10;
    a.process_id = pid;
    a.thread_id = 1;
    a.correlation_id = 7;
    t.api_calls.push_back(a);
    KernelRecord k;
    k.start = 20;
    k.end = 30;
    k.process_id = pid;
    k.correlation_id = 7;
    t.kernels.push_back(k);
  }
  const Attribution a = attribute(t);
  EXPECT_EQ(a.kernel_range[0], 0);
  EXPECT_EQ(a.kernel_range[1], 1);
}

// A training step as libtorch runs it: the main thread (1) holds step > forward / backward /
// optimizer open; the autograd thread (2) launches the backward's kernels and opens a library's
// range of its own (cub::DeviceRadixSort) in the middle of them.
Trace training_step() {
  Trace t;
  t.ranges.push_back(range("step", 100, 1000, 1));
  t.ranges.push_back(range("forward", 100, 300, 1));
  t.ranges.push_back(range("backward", 300, 800, 1));
  t.ranges.push_back(range("optimizer", 800, 990, 1));
  t.ranges.push_back(range("cub::DeviceRadixSort", 600, 650, 2));
  launch(t, "fwd", 150, 1, 160, 200);       // 0: forward, on the main thread
  launch(t, "bwd-a", 350, 2, 360, 400);     // 1: the autograd thread, no range of its own
  launch(t, "sort", 610, 2, 620, 630);      // 2: inside the autograd thread's own range
  launch(t, "bwd-b", 700, 2, 710, 750);     // 3: the autograd thread again
  launch(t, "adam", 850, 1, 860, 900);      // 4: optimizer
  launch(t, "late", 995, 2, 1000, 1010);    // 5: autograd thread, after optimizer closed: step only
  launch(t, "after", 1500, 2, 1510, 1520);  // 6: nothing open anywhere
  return t;
}

TEST(Projection, NoneKeepsTheLaunchingThreadsRanges) {
  const Trace t = training_step();
  const Attribution a = attribute(t);
  EXPECT_EQ(a.projection, RangeProjection::none);
  EXPECT_EQ(range_of_kernel(t, a, 0), "forward");
  EXPECT_EQ(range_of_kernel(t, a, 1), "<none>");
  EXPECT_EQ(range_of_kernel(t, a, 2), "cub::DeviceRadixSort");
  EXPECT_EQ(range_of_kernel(t, a, 3), "<none>");
  EXPECT_EQ(a.range_parent[index_of(t, "cub::DeviceRadixSort")], kNoRange);
  EXPECT_EQ(a.kernels_projected, 0u);
}

TEST(Projection, UnrangedThreadsFollowTheRangesOfTheirProcess) {
  const Trace t = training_step();
  const Attribution a = attribute(t, RangeProjection::unranged);
  EXPECT_EQ(range_of_kernel(t, a, 0), "forward");
  EXPECT_EQ(range_of_kernel(t, a, 1), "backward");
  EXPECT_EQ(range_of_kernel(t, a, 2), "cub::DeviceRadixSort");  // its own thread's range first
  EXPECT_EQ(range_of_kernel(t, a, 3), "backward");
  EXPECT_EQ(range_of_kernel(t, a, 4), "optimizer");
  EXPECT_EQ(range_of_kernel(t, a, 5), "step");
  EXPECT_EQ(range_of_kernel(t, a, 6), "<none>");
  // The library's range nests in the backward that the main thread held open when it opened.
  EXPECT_EQ(a.range_parent[index_of(t, "cub::DeviceRadixSort")], index_of(t, "backward"));
  EXPECT_TRUE(range_within(a, a.kernel_range[2], index_of(t, "step")));
  EXPECT_EQ(a.range_parent[index_of(t, "forward")], index_of(t, "step"));
  EXPECT_EQ(a.kernels_projected, 3u);  // bwd-a, bwd-b, late
}

TEST(Projection, AllPlacesEveryLaunchInTheInnermostRangeOfItsProcess) {
  Trace t;
  t.ranges.push_back(range("outer", 0, 1000, 1));
  t.ranges.push_back(range("worker", 200, 800, 2));
  launch(t, "main", 300, 1, 310, 320);   // thread 1 holds "outer"; "worker" opened later
  launch(t, "early", 100, 1, 110, 120);  // before "worker"
  launch(t, "w", 400, 2, 410, 420);
  const Attribution own = attribute(t, RangeProjection::unranged);
  EXPECT_EQ(range_of_kernel(t, own, 0), "outer");
  EXPECT_EQ(own.range_parent[index_of(t, "worker")], index_of(t, "outer"));
  const Attribution all = attribute(t, RangeProjection::all);
  EXPECT_EQ(range_of_kernel(t, all, 0), "worker");
  EXPECT_EQ(range_of_kernel(t, all, 1), "outer");
  EXPECT_EQ(range_of_kernel(t, all, 2), "worker");
  EXPECT_EQ(all.kernels_projected, 1u);
}

TEST(Projection, StaysWithinTheProcess) {
  Trace t = training_step();
  launch(t, "other-process", 400, 9, 410, 420);
  t.api_calls.back().process_id = 200;
  t.kernels.back().process_id = 200;
  const Attribution a = attribute(t, RangeProjection::all);
  EXPECT_EQ(a.kernel_range.back(), kNoRange);
}

TEST(Projection, CopiesFollowToo) {
  Trace t = training_step();
  ApiRecord call;
  call.start = 500;
  call.process_id = kPid;
  call.thread_id = 2;
  call.correlation_id = 77;
  t.api_calls.push_back(call);
  MemcpyRecord m;
  m.correlation_id = 77;
  m.process_id = kPid;
  t.memcpys.push_back(m);
  MemsetRecord s;
  s.correlation_id = 77;
  s.process_id = kPid;
  t.memsets.push_back(s);
  EXPECT_EQ(attribute(t).memcpy_range[0], kNoRange);
  const Attribution a = attribute(t, RangeProjection::unranged);
  EXPECT_EQ(a.memcpy_range[0], index_of(t, "backward"));
  EXPECT_EQ(a.memset_range[0], index_of(t, "backward"));
}

// Ranges of two threads that open at the same instant: the one that ends later encloses the
// other, never the other way round as well (no cycle of parents).
TEST(Projection, EqualStartsNestWithoutACycle) {
  Trace t;
  t.ranges.push_back(range("short", 100, 300, 2));
  t.ranges.push_back(range("long", 100, 500, 1));
  t.ranges.push_back(range("same", 100, 300, 3));
  for (RangeProjection p : {RangeProjection::unranged, RangeProjection::all}) {
    const Attribution a = attribute(t, p);
    EXPECT_EQ(a.range_parent[index_of(t, "long")], kNoRange);
    EXPECT_EQ(a.range_parent[index_of(t, "short")], index_of(t, "long"));
    EXPECT_EQ(a.range_parent[index_of(t, "same")], index_of(t, "short"));
  }
}

// A CUDA graph's kernels carry the correlation id of the graph's launch call: all of them belong
// to the range open at that call, whichever mode.
TEST(Projection, KernelsOfAGraphBelongToTheRangeOfItsLaunch) {
  Trace t = training_step();
  launch(t, "graph-node-0", 320, 2, 330, 340);
  t.api_calls.back().name = "cudaGraphLaunch_v10000";
  KernelRecord node = t.kernels.back();
  for (const char* name : {"graph-node-1", "graph-node-2"}) {
    node.name = name;
    node.start += 20;
    node.end += 20;
    t.kernels.push_back(node);
  }
  const size_t first = t.kernels.size() - 3;
  const Attribution none = attribute(t);
  const Attribution unranged = attribute(t, RangeProjection::unranged);
  for (size_t k = first; k < t.kernels.size(); ++k) {
    EXPECT_EQ(range_of_kernel(t, none, k), "<none>");
    EXPECT_EQ(range_of_kernel(t, unranged, k), "backward");
  }
}

// A case range "c [v]" with two repetitions, each a step > forward / backward, plus a copy; the
// backward's kernels come from the autograd thread.
Trace two_repetitions() {
  Trace t;
  t.ranges.push_back(range("c [v]", 0, 10000, 1));
  for (uint64_t base : {1000, 5000}) {
    t.ranges.push_back(range("rep", base, base + 3000, 1));
    t.ranges.push_back(range("step", base, base + 3000, 1));
    t.ranges.push_back(range("forward", base, base + 1000, 1));
    t.ranges.push_back(range("backward", base + 1000, base + 3000, 1));
    launch(t, "nvjet_sm90_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", base + 100, 1, base + 100, base + 400);  // 300
    launch(t, "void at::native::vectorized_layer_norm_kernel<float, float, false>(int)", base + 200, 1, base + 400,
           base + 500);  // 100
    launch(t, "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_kernel0_0", base + 1100, 2, base + 1100,
           base + 1700);                                                    // 600
    launch(t, "mystery_kernel", base + 1200, 2, base + 1700, base + 1750);  // 50
  }
  ApiRecord call;
  call.start = 9000;  // in the case range, outside both repetitions
  call.process_id = kPid;
  call.thread_id = 1;
  call.correlation_id = 500;
  t.api_calls.push_back(call);
  MemcpyRecord m;
  m.start = 9000;
  m.end = 9200;
  m.correlation_id = 500;
  m.process_id = kPid;
  t.memcpys.push_back(m);
  launch(t, "outside", 12000, 1, 12000, 12100);  // after the case range
  return t;
}

TEST(Breakdown, CategoriesAndNestedRangesOfACase) {
  const Trace t = two_repetitions();
  const Attribution a = attribute(t, RangeProjection::unranged);
  const std::vector<RangeBreakdown> b = break_down_ranges(t, a, {"c [v]", "missing"});
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].name, "missing");
  EXPECT_EQ(b[1].instances, 0u);
  EXPECT_EQ(b[1].gpu_ns, 0u);
  const RangeBreakdown& c = b[0];
  EXPECT_EQ(c.instances, 1u);
  EXPECT_EQ(c.repetitions, 2u);
  EXPECT_EQ(c.kernels, 8u);
  EXPECT_EQ(c.gpu_ns, 2 * (300 + 100 + 600 + 50) + 200u);
  auto ns = [&](KernelCategory k) { return c.category_ns[static_cast<size_t>(k)]; };
  EXPECT_EQ(ns(KernelCategory::gemm), 600u);
  EXPECT_EQ(ns(KernelCategory::normalization), 200u);
  EXPECT_EQ(ns(KernelCategory::attention), 1200u);
  EXPECT_EQ(ns(KernelCategory::other), 100u);
  EXPECT_EQ(ns(KernelCategory::copy), 200u);  // the memcpy
  // Repetitions are left out of the paths; parents come before their nested ranges.
  ASSERT_EQ(c.nested.size(), 3u);
  EXPECT_EQ(c.nested[0].path, (std::vector<std::string>{"step"}));
  EXPECT_EQ(c.nested[0].gpu_ns, 2100u);
  EXPECT_EQ(c.nested[1].path, (std::vector<std::string>{"step", "forward"}));
  EXPECT_EQ(c.nested[1].gpu_ns, 800u);
  EXPECT_EQ(c.nested[2].path, (std::vector<std::string>{"step", "backward"}));
  EXPECT_EQ(c.nested[2].gpu_ns, 1300u);
  // Without the projection the autograd thread's kernels fall outside the case.
  const RangeBreakdown own = break_down_ranges(t, attribute(t), {"c [v]"}).front();
  EXPECT_EQ(own.gpu_ns, 2 * (300 + 100) + 200u);
}

TEST(Breakdown, SiblingsInTheOrderTheyRanAndNearestBrokenDownRange) {
  Trace t;
  t.ranges.push_back(range("outer", 0, 1000, 1));
  t.ranges.push_back(range("b", 100, 200, 1));
  t.ranges.push_back(range("a", 300, 400, 1));
  t.ranges.push_back(range("inner", 500, 900, 1));
  t.ranges.push_back(range("b", 600, 700, 1));
  launch(t, "k1", 350, 1, 350, 360);  // a
  launch(t, "k2", 150, 1, 150, 170);  // b
  launch(t, "k3", 650, 1, 650, 690);  // inner > b: belongs to "inner" only
  const Attribution attribution = attribute(t);
  const std::vector<RangeBreakdown> b = break_down_ranges(t, attribution, {"outer", "inner"});
  ASSERT_EQ(b[0].nested.size(), 2u);
  EXPECT_EQ(b[0].nested[0].path, (std::vector<std::string>{"b"}));  // ran first, though listed later
  EXPECT_EQ(b[0].nested[1].path, (std::vector<std::string>{"a"}));
  EXPECT_EQ(b[0].gpu_ns, 30u);
  EXPECT_EQ(b[1].gpu_ns, 40u);
  EXPECT_EQ(b[1].repetitions, 0u);
}

}  // namespace
}  // namespace fusekit::profiler
