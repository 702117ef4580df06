// The top-k selection's threshold search (dp/topk_threshold.h, the code the kernels run) against
// exact counts on the host: normal, Laplace and Cauchy layers of 1 to 1,000,003 elements at
// densities 1e-4 to 1 meet the tolerance within the 4 counting passes; layers of ties (all equal,
// all zero) never exceed cap; the accepted count is the count of the accepted threshold.
#include "dp/topk_threshold.h"
#include "dp/topk_selection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace fusekit::dp {
namespace {

struct Outcome {
  ThresholdSearch search;
  long long exact_count;  // #{|x| >= threshold}, counted again
};

// The kernels' sequence on the host: the strided sample's estimate, then up to kSelectionPasses
// counting passes, each followed by a step.
Outcome run_search(const std::vector<float>& x, double density) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int m = static_cast<int>(std::min<int64_t>(n, kSelectionSampleSize));
  std::vector<float> sample;
  for (int j = 0; j < m; ++j) sample.push_back(std::fabs(x[static_cast<int64_t>(j) * n / m]));
  std::sort(sample.begin(), sample.end());
  const int sample_k = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(std::ceil(density * m)), 1, m));
  Outcome out{};
  ThresholdSearch& s = out.search;
  threshold_search_start(s, n, density, sample[m - sample_k]);
  for (int pass = 0; pass < kSelectionPasses && !s.done; ++pass) {
    for (float v : x) {
      const uint32_t bits = magnitude_bits_of(v);
      for (int j = 0; j < kThresholdCandidates; ++j) s.counts[j] += bits >= s.candidates[j];
    }
    threshold_search_step(s, pass, pass == kSelectionPasses - 1);
  }
  for (float v : x) out.exact_count += magnitude_bits_of(v) >= s.threshold_bits;
  return out;
}

TEST(TopkThreshold, ContinuousLayersMeetTheTolerance) {
  std::mt19937 rng(5);
  int layers = 0, first_pass = 0;
  for (double density : {1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0}) {
    for (int64_t n : {1, 2, 7, 33, 1000, 1024, 1025, 4097, 65537, 300001, 1000003}) {
      for (int distribution = 0; distribution < 3; ++distribution) {
        std::normal_distribution<float> normal(0.f, 1.f);
        std::exponential_distribution<float> exponential(1.f);
        std::cauchy_distribution<float> cauchy(0.f, 1.f);
        std::vector<float> x(n);
        for (float& v : x) {
          v = distribution == 0   ? normal(rng)
              : distribution == 1 ? exponential(rng) * (rng() % 2 ? 1.f : -1.f)
                                  : cauchy(rng);
        }
        const Outcome o = run_search(x, density);
        const ThresholdSearch& s = o.search;
        SCOPED_TRACE("density " + std::to_string(density) + ", n " + std::to_string(n) + ", distribution " +
                     std::to_string(distribution) + ", k " + std::to_string(s.k) + ", count " +
                     std::to_string(s.count) + ", passes " + std::to_string(s.passes));
        ASSERT_EQ(s.done, 1);
        EXPECT_EQ(s.k, static_cast<int64_t>(selected_entries(n, density)));
        EXPECT_EQ(s.count, o.exact_count);
        EXPECT_GE(s.count, selection_low(s.k));
        EXPECT_LE(s.count, selection_cap(s.k));
        EXPECT_LE(s.passes, kSelectionPasses);
        if (n <= kSelectionSampleSize) {  // the sample is the layer: exact
          EXPECT_EQ(s.passes, 1);
        }
        ++layers;
        first_pass += s.passes == 1;
      }
    }
  }
  EXPECT_GE(first_pass, layers * 3 / 4);  // the sample's estimate mostly suffices
}

TEST(TopkThreshold, TiesNeverExceedCap) {
  for (int64_t n : {10, 5000, 50000}) {
    for (double density : {0.01, 0.5}) {
      std::vector<float> equal(n), zeros(n, 0.f), mostly_zero(n, 0.f);
      for (int64_t i = 0; i < n; ++i) equal[i] = i % 2 ? 0.5f : -0.5f;
      for (int64_t i = 0; i < n; i += 7) mostly_zero[i] = 1.f + static_cast<float>(i) / static_cast<float>(n);
      for (const auto* x : {&equal, &zeros, &mostly_zero}) {
        const Outcome o = run_search(*x, density);
        SCOPED_TRACE("n " + std::to_string(n) + ", density " + std::to_string(density));
        EXPECT_EQ(o.search.done, 1);
        EXPECT_LE(o.search.count, selection_cap(o.search.k));
        EXPECT_EQ(o.search.count, o.exact_count);
      }
    }
  }
}

}  // namespace
}  // namespace fusekit::dp
