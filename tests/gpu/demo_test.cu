// The demo suite's kernels against a float64 reference on fresh random inputs, with the outputs
// poisoned (NaN) before each run, at a size that is not a multiple of the vector width's blocks.
#include <gtest/gtest.h>

#include <cmath>

#include "gpu_test_support.h"
#include "suites/demo.h"

namespace fusekit::suites {
namespace {

double relative_error(const std::vector<float>& out, const std::vector<float>& x) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = static_cast<double>(DemoSuite::kScale) * x[i] + static_cast<double>(DemoSuite::kBias);
    if (std::isnan(out[i])) return INFINITY;  // NaN never passes: an unwritten element
    diff += (out[i] - ref) * (out[i] - ref);
    norm += ref * ref;
  }
  return std::sqrt(diff / norm);
}

TEST(DemoSuite, BaselineAndFusedMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  DemoSuite demo(1'000'003);
  ASSERT_GE(demo.sets(), 3);
  demo.upload(nullptr);  // also poisons every output set
  demo.run_baseline(nullptr, 0);
  demo.run_fused(nullptr, 1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(relative_error(demo.download(0), demo.input(0)), 1e-6);
  EXPECT_LT(relative_error(demo.download(1), demo.input(1)), 1e-6);
  // A set nobody ran stays poisoned: the check can fail.
  EXPECT_TRUE(std::isinf(relative_error(demo.download(2), demo.input(2))));
}

}  // namespace
}  // namespace fusekit::suites
