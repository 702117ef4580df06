// The sparse reduce-scatter's partition: balanced against equal-width slices on uniform and
// clustered selections, the bound when one bin alone exceeds the mean, and P = 1, 2, 4, 8.
#include "dp/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace fusekit::dp {
namespace {

constexpr uint64_t kElements = 10'000'019;  // not a multiple of the bin count
constexpr size_t kBins = 4096;

// Checks the invariants every partition keeps: P + 1 monotone edges from 0 to B, loads that sum
// to the total, imbalance = max / mean, and the optimum's bound max(mean, largest) <= max <= mean + largest.
void check(const Partition& p, std::span<const uint64_t> loads, int ranks, bool balanced) {
  ASSERT_EQ(p.edges.size(), static_cast<size_t>(ranks) + 1);
  EXPECT_EQ(p.edges.front(), 0u);
  EXPECT_EQ(p.edges.back(), loads.size());
  EXPECT_TRUE(std::is_sorted(p.edges.begin(), p.edges.end()));
  const uint64_t total = std::accumulate(loads.begin(), loads.end(), uint64_t{0});
  EXPECT_EQ(p.total, total);
  EXPECT_EQ(std::accumulate(p.loads.begin(), p.loads.end(), uint64_t{0}), total);
  if (total == 0) return;
  const double mean = static_cast<double>(total) / ranks;
  const double max_load = static_cast<double>(*std::max_element(p.loads.begin(), p.loads.end()));
  EXPECT_DOUBLE_EQ(p.imbalance, max_load / mean);
  if (balanced) {
    const double largest = static_cast<double>(*std::max_element(loads.begin(), loads.end()));
    EXPECT_GE(max_load, std::max(std::ceil(mean), largest));
    EXPECT_LE(max_load, mean + largest);
    if (loads.size() >= static_cast<size_t>(ranks)) {
      for (int r = 0; r < ranks; ++r) {
        EXPECT_LT(p.edges[r], p.edges[r + 1]) << "slice " << r << " has no bins";
      }
    }
  }
}

// Histograms of `ranks` ranks, each selecting `k` indices drawn by `draw`.
template <class Draw>
std::vector<uint64_t> loads_of(int ranks, uint64_t k, Draw draw) {
  std::vector<std::vector<uint64_t>> histograms;
  for (int r = 0; r < ranks; ++r) {
    std::vector<uint64_t> indices;
    for (uint64_t i = 0; i < k; ++i) indices.push_back(draw(r));
    histograms.push_back(selection_histogram(indices, kElements, kBins));
  }
  return bin_loads(histograms);
}

TEST(Partition, UniformSelectionsBalanceEitherWay) {
  std::mt19937_64 rng(1);
  for (int ranks : {1, 2, 4, 8}) {
    const auto loads = loads_of(ranks, 20000, [&](int) { return rng() % kElements; });
    const Partition balanced = balanced_partition(loads, ranks), equal = equal_partition(loads, ranks);
    check(balanced, loads, ranks, true);
    check(equal, loads, ranks, false);
    EXPECT_LE(balanced.imbalance, 1.2);
    EXPECT_LE(equal.imbalance, 1.2);
    EXPECT_LE(balanced.imbalance, equal.imbalance + 1e-12);
    if (ranks == 1) {
      EXPECT_EQ(balanced.imbalance, 1.0);
    }
  }
}

// All large gradients in one layer: 90% of every rank's entries fall in 3% of the index space.
TEST(Partition, ClusteredSelectionsBalanceOnlyWhenBalanced) {
  std::mt19937_64 rng(2);
  const uint64_t layer_start = kElements / 2, layer_size = kElements * 3 / 100;
  for (int ranks : {2, 4, 8}) {
    const auto loads = loads_of(
        ranks, 20000, [&](int) { return rng() % 10 < 9 ? layer_start + rng() % layer_size : rng() % kElements; });
    const Partition balanced = balanced_partition(loads, ranks), equal = equal_partition(loads, ranks);
    check(balanced, loads, ranks, true);
    check(equal, loads, ranks, false);
    EXPECT_LE(balanced.imbalance, 1.2) << ranks;
    EXPECT_GE(equal.imbalance, 0.9 * ranks) << ranks;  // one slice takes the layer: about P times the mean
    const auto edges = element_edges(balanced, kElements, kBins);
    EXPECT_EQ(edges.front(), 0u);
    EXPECT_EQ(edges.back(), kElements);
  }
}

// One bin alone holds more than the mean: its slice carries at least that bin, so the imbalance is
// at least largest / mean (and at most 1 + largest / mean, check()). With 4 or more ranks the bins
// on either side of it fit in slices of their own, so here it is exactly largest / mean; with 2,
// the hot bin's slice must also take all the bins on one side of it.
TEST(Partition, SingleHotBinBoundsTheImbalance) {
  for (int ranks : {2, 4, 8}) {
    std::vector<uint64_t> loads(kBins, 10);
    loads[kBins / 3] = 10 * kBins;  // about half of the total
    const Partition p = balanced_partition(loads, ranks);
    check(p, loads, ranks, true);
    const double mean = static_cast<double>(p.total) / ranks;
    const double hot = static_cast<double>(loads[kBins / 3]);
    if (ranks >= 4) {
      EXPECT_DOUBLE_EQ(p.imbalance, hot / mean) << ranks;
    }
    // Two ranks: the hot bin with the 1365 bins before it, against the 2730 after it.
    if (ranks == 2) {
      EXPECT_DOUBLE_EQ(p.imbalance, (hot + 10.0 * (kBins / 3)) / mean);
    }
    EXPECT_GE(p.imbalance, hot / mean);
    EXPECT_GT(p.imbalance, 1.2);
  }
}

TEST(Partition, EdgeCases) {
  const std::vector<uint64_t> empty(16, 0);
  const Partition none = balanced_partition(empty, 4);
  check(none, empty, 4, true);
  EXPECT_EQ(none.imbalance, 1.0);
  const std::vector<uint64_t> few = {5, 7};  // fewer bins than ranks: two slices stay empty
  const Partition p = balanced_partition(few, 4);
  check(p, few, 4, false);
  EXPECT_EQ(*std::max_element(p.loads.begin(), p.loads.end()), 7u);
  EXPECT_THROW(balanced_partition(few, 0), std::invalid_argument);
  EXPECT_THROW(selection_histogram(std::vector<uint64_t>{10}, 10, 4), std::invalid_argument);
  EXPECT_THROW(bin_loads({{1, 2}, {1}}), std::invalid_argument);
  EXPECT_EQ(bin_width(10, 4), 3u);
  EXPECT_EQ(selection_histogram(std::vector<uint64_t>{0, 2, 3, 9}, 10, 4), (std::vector<uint64_t>{2, 1, 0, 1}));
}

}  // namespace
}  // namespace fusekit::dp
