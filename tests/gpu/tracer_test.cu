// The CUPTI tracer on a program whose activity is known: kernels of known names, counts and
// durations, copies and a memset, nested NVTX ranges on two threads, two streams, and a stretch
// with the tracer stopped. Names, counts, attribution and time shares must match what ran.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <algorithm>
#include <thread>
#include <vector>

#include "gpu_test_support.h"
#include "profiler/attribution.h"
#include "profiler/cupti_tracer.h"
#include "profiler/range.h"
#include "profiler/summary.h"

namespace fusekit::profiler {
namespace {

// Set before main, hence before the first NVTX call of the process.
const std::string kNvtxInjection = prepare_nvtx_injection();

__device__ uint64_t global_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Busy-waits `ns` nanoseconds, so the kernels' durations, hence their time shares, are known.
__global__ void spin_a(uint64_t ns, int* sink) {
  const uint64_t start = global_time_ns();
  while (global_time_ns() - start < ns) {
  }
  if (threadIdx.x == 0 && sink) atomicAdd(sink, 1);
}
__global__ void spin_b(uint64_t ns, int* sink) {
  const uint64_t start = global_time_ns();
  while (global_time_ns() - start < ns) {
  }
  if (threadIdx.x == 0 && sink) atomicAdd(sink, 1);
}
__global__ void outside_kernel(int* sink) {
  if (threadIdx.x == 0) atomicAdd(sink, 1);
}
__global__ void while_stopped_kernel(int* sink) {
  if (threadIdx.x == 0) atomicAdd(sink, 1);
}

#define CHECK_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

size_t count_named(const Trace& t, const std::string& part) {
  return std::count_if(t.kernels.begin(), t.kernels.end(),
                       [&](const KernelRecord& k) { return k.name.find(part) != std::string::npos; });
}

TEST(Tracer, KnownKernelsCopiesAndNestedRangesOnTwoThreads) {
  FUSEKIT_REQUIRE_GPU();
  ASSERT_FALSE(kNvtxInjection.empty()) << "NVTX_INJECTION64_PATH could not be set";
  int* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(int)));
  std::vector<char> host(1 << 20, 1);
  char* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, host.size()));
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CHECK_CUDA(cudaDeviceSynchronize());

  CuptiTracer& tracer = CuptiTracer::instance();
  tracer.flush(true);  // nothing from before this test
  tracer.start();
  constexpr uint64_t kA = 200'000, kB = 400'000;  // ns: a runs 3 x 200 us, b 2 x 400 us
  std::thread thread_a([&] {
    ScopedRange outer("thread-a");
    {
      ScopedRange inner("inner-a");
      for (int i = 0; i < 3; ++i) spin_a<<<1, 32, 0, s1>>>(kA, sink);
      cudaMemcpyAsync(device, host.data(), host.size(), cudaMemcpyHostToDevice, s1);
    }
    cudaStreamSynchronize(s1);
  });
  std::thread thread_b([&] {
    ScopedRange range("thread-b");
    for (int i = 0; i < 2; ++i) spin_b<<<1, 32, 0, s2>>>(kB, sink);
    cudaMemsetAsync(device, 0, 4096, s2);
    cudaStreamSynchronize(s2);
  });
  thread_a.join();
  thread_b.join();
  outside_kernel<<<1, 32>>>(sink);
  CHECK_CUDA(cudaDeviceSynchronize());
  tracer.stop();
  while_stopped_kernel<<<1, 32>>>(sink);
  CHECK_CUDA(cudaDeviceSynchronize());
  const Trace t = tracer.flush(true);

  EXPECT_EQ(t.dropped_records, 0u);
  EXPECT_EQ(count_named(t, "spin_a"), 3u);
  EXPECT_EQ(count_named(t, "spin_b"), 2u);
  EXPECT_EQ(count_named(t, "outside_kernel"), 1u);
  EXPECT_EQ(count_named(t, "while_stopped_kernel"), 0u) << "a kernel ran while the tracer was stopped";
  ASSERT_EQ(t.memcpys.size(), 1u);
  EXPECT_EQ(t.memcpys[0].bytes, host.size());
  ASSERT_EQ(t.memsets.size(), 1u);
  EXPECT_EQ(t.memsets[0].bytes, 4096u);

  // Demangled names, launch geometry, streams.
  for (const KernelRecord& k : t.kernels) {
    if (k.name.find("spin_a") != std::string::npos) {
      EXPECT_NE(k.name.find("spin_a(unsigned long"), std::string::npos) << k.name;
      EXPECT_EQ(k.block_x, 32);
      EXPECT_EQ(k.grid_x, 1);
      EXPECT_GT(k.registers_per_thread, 0);
      EXPECT_GE(k.end - k.start, kA);
      EXPECT_EQ(k.stream_id, t.memcpys[0].stream_id);
    }
    if (k.name.find("spin_b") != std::string::npos) EXPECT_EQ(k.stream_id, t.memsets[0].stream_id);
  }
  EXPECT_NE(t.memcpys[0].stream_id, t.memsets[0].stream_id);

  // Ranges: three push/pop ranges, inner-a nested in thread-a, the threads distinct.
  ASSERT_EQ(t.ranges.size(), 3u);
  const Attribution a = attribute(t);
  auto range_index = [&](const std::string& text) {
    for (size_t i = 0; i < t.ranges.size(); ++i) {
      if (t.ranges[i].text == text) return static_cast<int>(i);
    }
    return kNoRange;
  };
  const int ta = range_index("thread-a"), ia = range_index("inner-a"), tb = range_index("thread-b");
  ASSERT_NE(ta, kNoRange);
  ASSERT_NE(ia, kNoRange);
  ASSERT_NE(tb, kNoRange);
  for (const RangeRecord& r : t.ranges) EXPECT_EQ(r.event_type, kNvtxPushPopRange) << r.text;
  EXPECT_EQ(a.range_parent[ia], ta);
  EXPECT_EQ(a.range_parent[tb], kNoRange);
  EXPECT_NE(t.ranges[ta].thread_id, t.ranges[tb].thread_id);
  EXPECT_EQ(a.kernels_without_api_record, 0u);

  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const std::string& name = t.kernels[i].name;
    const int r = a.kernel_range[i];
    if (name.find("spin_a") != std::string::npos) EXPECT_EQ(r, ia);
    if (name.find("spin_b") != std::string::npos) EXPECT_EQ(r, tb);
    if (name.find("outside_kernel") != std::string::npos) EXPECT_EQ(r, kNoRange);
  }
  EXPECT_EQ(a.memcpy_range[0], ia);
  EXPECT_EQ(a.memset_range[0], tb);

  // Shares: spin_a 600 us and spin_b 800 us of ~1400 us of kernel time.
  const auto kernels = summarize_kernels(t, a, std::nullopt, true);
  double share_a = 0, share_b = 0;
  for (const auto& k : kernels) {
    if (k.name == "spin_a") share_a = k.time_percent;
    if (k.name == "spin_b") share_b = k.time_percent;
  }
  EXPECT_NEAR(share_a, 100.0 * 600 / 1400, 3.0);
  EXPECT_NEAR(share_b, 100.0 * 800 / 1400, 3.0);
  const auto in_thread_a = summarize_kernels(t, a, std::string("thread-a"), true);
  ASSERT_EQ(in_thread_a.size(), 1u);
  EXPECT_EQ(in_thread_a[0].name, "spin_a");
  EXPECT_EQ(in_thread_a[0].instances, 3u);

  cudaFree(sink);
  cudaFree(device);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

TEST(Tracer, ManyShortKernelsAreAllRecorded) {
  FUSEKIT_REQUIRE_GPU();
  int* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(int)));
  CuptiTracer& tracer = CuptiTracer::instance();
  tracer.flush(true);
  tracer.start();
  constexpr int kLaunches = 50'000;  // several CUPTI buffers' worth
  {
    ScopedRange range("many");
    for (int i = 0; i < kLaunches; ++i) outside_kernel<<<1, 32>>>(sink);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  tracer.stop();
  const Trace t = tracer.flush(true);
  EXPECT_EQ(t.dropped_records, 0u);
  EXPECT_EQ(count_named(t, "outside_kernel"), static_cast<size_t>(kLaunches));
  const Attribution a = attribute(t);
  EXPECT_EQ(std::count(a.kernel_range.begin(), a.kernel_range.end(), 0), kLaunches);
  cudaFree(sink);
}

}  // namespace
}  // namespace fusekit::profiler
