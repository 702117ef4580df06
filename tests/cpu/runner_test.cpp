// The runner's batch of repetitions a timed sample (suites/runner.h): no GPU needed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "suites/runner.h"

namespace fusekit::suites {
namespace {

TEST(SampleBatch, SpansTheSampleTime) {
  EXPECT_EQ(sample_batch(500, 0.031), 17);  // 31 us a repetition: 17 x 31 = 527 us >= 500
  EXPECT_EQ(sample_batch(500, 0.1), 5);     // exactly 500 us
  EXPECT_EQ(sample_batch(500, 0.074), 7);
}

TEST(SampleBatch, LongRepetitionsAreOneASample) {
  EXPECT_EQ(sample_batch(500, 0.5), 1);
  EXPECT_EQ(sample_batch(500, 12.0), 1);
}

TEST(SampleBatch, ZeroMeansOneRepetitionASample) {
  EXPECT_EQ(sample_batch(0, 0.01), 1);
  EXPECT_EQ(sample_batch(-1, 0.01), 1);
}

TEST(SampleBatch, BoundedAndSafeOnBadEstimates) {
  EXPECT_EQ(sample_batch(500, 1e-6), kMaxSampleBatch);
  EXPECT_EQ(sample_batch(500, 0.0), 1);
  EXPECT_EQ(sample_batch(500, std::numeric_limits<double>::quiet_NaN()), 1);
  EXPECT_EQ(sample_batch(std::numeric_limits<double>::quiet_NaN(), 0.01), 1);
}

}  // namespace
}  // namespace fusekit::suites
