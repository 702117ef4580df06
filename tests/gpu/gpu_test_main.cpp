// The main of every GPU test program (in place of GoogleTest's): runs the selected cases and, where
// no GPU is present, exits with kSkippedWithoutGpu instead of 0, so that ctest, which runs a whole
// program as one test, reports it as skipped (SKIP_RETURN_CODE) and not as passed. Without a GPU the
// GPU cases skip (FUSEKIT_REQUIRE_GPU) while the few that only check arguments on the host pass; the
// program has not been tested either way. A program with a failed case exits 1, GPU or not.
#include <gtest/gtest.h>

#include <cstdio>

#include "profiler/environment.h"

namespace {
// tests/gpu/CMakeLists.txt gives this code to ctest as SKIP_RETURN_CODE; 77 is the code Automake's
// and Meson's test drivers read as "skipped".
constexpr int kSkippedWithoutGpu = 77;
}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const testing::UnitTest& unit_test = *testing::UnitTest::GetInstance();
  if (result != 0 || unit_test.failed_test_count() > 0 || unit_test.skipped_test_count() == 0) return result;
  const std::string reason = fusekit::profiler::gpu_unavailable_reason();
  if (reason.empty()) return result;
  std::printf("no GPU (%s): %d cases skipped, %d passed without one; exit code %d (skipped)\n", reason.c_str(),
              unit_test.skipped_test_count(), unit_test.successful_test_count(), kSkippedWithoutGpu);
  return kSkippedWithoutGpu;
}
