// `fusekit trace -- cmd` on unmodified programs: a plain CUDA program with known activity, and a
// PyTorch training loop, whose total kernel time is checked against PyTorch's own profiler.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "gpu_test_support.h"
#include "profiler/attribution.h"
#include "profiler/summary.h"
#include "store/store.h"

namespace fusekit {
namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code;
  std::string output;
};

Result run(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((command + " 2>&1").c_str(), "r"), pclose);
  std::string output;
  std::array<char, 4096> buf{};
  while (pipe && fgets(buf.data(), buf.size(), pipe.get())) output += buf.data();
  int status = pclose(pipe.release());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string temp_db(const char* name) {
  fs::path p = fs::temp_directory_path() / (std::string("fusekit_") + name + "_" + std::to_string(getpid()) + ".db");
  fs::remove(p);
  fs::remove(p.string() + "-wal");
  fs::remove(p.string() + "-shm");
  return p.string();
}

bool torch_with_cuda() {
  return run("python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'").exit_code == 0;
}

TEST(TraceCommand, PlainCudaProgram) {
  FUSEKIT_REQUIRE_GPU();
  const std::string db = temp_db("plain");
  const Result r = run(std::string(FUSEKIT_BINARY) + " trace --db " + db + " -- " + TRACED_PROGRAM);
  ASSERT_EQ(r.exit_code, 3) << "the program's exit code must pass through\n" << r.output;
  EXPECT_NE(r.output.find("traced_program: done"), std::string::npos) << r.output;

  store::Store store = store::Store::open(db, store::Store::Mode::read_only);
  const store::RunInfo info = store.run(store.latest_run());
  EXPECT_EQ(info.status, "failed");
  EXPECT_EQ(info.exit_code, 3);
  EXPECT_EQ(info.dropped_records, 0u);
  const profiler::Trace t = store.load_trace(info.id);
  const profiler::Attribution a = profiler::attribute(t);
  int traced = 0, outside = 0;
  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const std::string& name = t.kernels[i].name;
    const std::string range = a.kernel_range[i] == profiler::kNoRange ? "" : t.ranges[a.kernel_range[i]].text;
    if (name.find("traced_kernel") != std::string::npos) {
      ++traced;
      EXPECT_EQ(range, "inner");
      EXPECT_EQ(t.kernels[i].block_x, 256);
    }
    if (name.find("untraced_range_kernel") != std::string::npos) {
      ++outside;
      EXPECT_EQ(range, "");
    }
  }
  EXPECT_EQ(traced, 4);
  EXPECT_EQ(outside, 1);
  ASSERT_GE(t.memcpys.size(), 1u);
  EXPECT_EQ(t.memcpys[0].bytes, (1u << 20) * sizeof(float));
  ASSERT_EQ(t.ranges.size(), 2u);
  fs::remove(db);
}

TEST(TraceCommand, MissingProgramFailsClearly) {
  FUSEKIT_REQUIRE_GPU();
  const std::string db = temp_db("missing");
  const Result r = run(std::string(FUSEKIT_BINARY) + " trace --db " + db + " -- /nonexistent/program");
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_NE(r.output.find("cannot run"), std::string::npos) << r.output;
  fs::remove(db);
}

TEST(TraceCommand, PyTorchTrainingLoopMatchesTorchProfiler) {
  FUSEKIT_REQUIRE_GPU();
  if (!torch_with_cuda()) GTEST_SKIP() << "no PyTorch with CUDA";
  const std::string db = temp_db("torch");
  const Result traced = run(std::string(FUSEKIT_BINARY) + " trace --db " + db + " -- python3 " + TORCH_TRAIN_LOOP +
                            " --steps 30 --exit-code 4");
  ASSERT_EQ(traced.exit_code, 4) << traced.output;

  store::Store store = store::Store::open(db, store::Store::Mode::read_only);
  const profiler::Trace t = store.load_trace(store.latest_run());
  const profiler::Attribution a = profiler::attribute(t);
  bool gemm = false, elementwise = false;
  for (const auto& k : t.kernels) {
    gemm |= k.name.find("gemm") != std::string::npos || k.name.find("xmma") != std::string::npos ||
            k.name.find("cutlass") != std::string::npos;
    elementwise |= k.name.find("elementwise") != std::string::npos;
  }
  EXPECT_TRUE(gemm) << "no cuBLAS GEMM kernel recorded";
  EXPECT_TRUE(elementwise) << "no elementwise kernel recorded";
  const auto ranges = profiler::summarize_ranges(t, a);
  uint64_t steps = 0, step_kernels = 0;
  for (const auto& r : ranges) {
    if (r.name == "train_step") {
      steps = r.instances;
      step_kernels = r.kernels;
    }
  }
  EXPECT_EQ(steps, 30u);
  EXPECT_GT(step_kernels, 30u * 5);
  // The loop's kernels by time: the loop synchronizes before its range closes, and the warm-up
  // before it opens, so exactly its kernels run inside the range's interval. (By attribution,
  // kernels that autograd launches from its own thread belong to no range of the main thread,
  // as in Nsight Systems.)
  const profiler::RangeRecord* loop = nullptr;
  for (const auto& r : t.ranges) {
    if (r.text == "train_loop") loop = &r;
  }
  ASSERT_NE(loop, nullptr);
  uint64_t fusekit_ns = 0, loop_kernels = 0;
  std::map<uint32_t, uint64_t> kernels_per_thread;
  std::map<uint32_t, const profiler::ApiRecord*> call;
  for (const auto& api : t.api_calls) call[api.correlation_id] = &api;
  for (const auto& k : t.kernels) {
    if (k.start < loop->start || k.end > loop->end) continue;
    fusekit_ns += k.end - k.start;
    ++loop_kernels;
    auto it = call.find(k.correlation_id);
    ++kernels_per_thread[it == call.end() ? 0 : it->second->thread_id];
  }
  for (auto [thread, count] : kernels_per_thread)
    std::printf("thread %u launched %llu of the loop's kernels\n", thread, static_cast<unsigned long long>(count));

  const std::string json =
      (fs::temp_directory_path() / ("fusekit_torch_profile_" + std::to_string(getpid()) + ".json")).string();
  const Result profiled = run(std::string("python3 ") + TORCH_TRAIN_LOOP + " --steps 30 --torch-profiler " + json);
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  const size_t at = profiled.output.find("torch_profiler_kernel_ns ");
  ASSERT_NE(at, std::string::npos) << profiled.output;
  const double torch_ns = std::stod(profiled.output.substr(at + 25));
  const size_t kernels_at = profiled.output.find("torch_profiler_kernels ");
  const std::string torch_kernels =
      kernels_at == std::string::npos
          ? "?"
          : profiled.output.substr(kernels_at + 23, profiled.output.find('\n', kernels_at) - kernels_at - 23);
  std::printf(
      "total GPU kernel time of the loop: fusekit trace %.3f ms (%llu kernels), torch.profiler %.3f ms (%s kernels), "
      "ratio %.4f\n",
      fusekit_ns / 1e6, static_cast<unsigned long long>(loop_kernels), torch_ns / 1e6, torch_kernels.c_str(),
      fusekit_ns / torch_ns);
  RecordProperty("fusekit_kernel_ns", std::to_string(fusekit_ns));
  RecordProperty("torch_profiler_kernel_ns", std::to_string(static_cast<uint64_t>(torch_ns)));
  EXPECT_NEAR(static_cast<double>(fusekit_ns) / torch_ns, 1.0, 0.05);
  fs::remove(db);
  fs::remove(json);
}

}  // namespace
}  // namespace fusekit
