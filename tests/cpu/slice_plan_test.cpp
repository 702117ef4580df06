// The sparse collective's host bookkeeping: per rank, the counts and offsets that the histogram
// gives match the rank's real indices slice by slice, every rank derives the same slices, the
// owners' loads add up, the balanced slices stay within 1.2x the mean where selections cluster
// (the equal ones do not), each reduced slice travels in its smaller form, and the entry slices fit
// the gather buffer's bound.
#include "dp/slice_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

namespace fusekit::dp {
namespace {

constexpr uint64_t kElements = 10'000'019;
constexpr size_t kBins = 4096;

// Per rank, `k` distinct sorted indices: uniform, or 80% of them in three windows of 1% each, all
// three in the first eighth of the index space (equal slices put them on rank 0).
std::vector<std::vector<uint64_t>> selections(int ranks, uint64_t k, bool clustered, unsigned seed) {
  std::mt19937_64 rng(seed);
  const uint64_t window = kElements / 100;
  const uint64_t starts[3] = {kElements / 40, kElements / 16, kElements / 10};
  std::vector<std::vector<uint64_t>> out;
  for (int r = 0; r < ranks; ++r) {
    std::set<uint64_t> chosen;
    while (chosen.size() < k) {
      if (clustered && rng() % 10 < 8) {
        chosen.insert(starts[rng() % 3] + rng() % window);
      } else {
        chosen.insert(rng() % kElements);
      }
    }
    out.emplace_back(chosen.begin(), chosen.end());
  }
  return out;
}

TEST(SlicePlan, HistogramCountsMatchTheIndices) {
  for (bool clustered : {false, true}) {
    for (int ranks : {1, 2, 4, 8}) {
      for (SlicePartition kind : {SlicePartition::balanced, SlicePartition::equal}) {
        SCOPED_TRACE(std::string(clustered ? "clustered" : "uniform") + ", " + std::to_string(ranks) + " ranks, " +
                     (kind == SlicePartition::balanced ? "balanced" : "equal"));
        const auto chosen = selections(ranks, 20000, clustered, 7 * ranks + clustered);
        std::vector<std::vector<uint64_t>> histograms;
        for (const auto& indices : chosen) histograms.push_back(selection_histogram(indices, kElements, kBins));
        const std::vector<uint64_t> loads = bin_loads(histograms);
        std::vector<uint64_t> owner_loads(ranks, 0);
        std::vector<uint64_t> first_edges;
        for (int rank = 0; rank < ranks; ++rank) {
          const SlicePlan plan = plan_slices(histograms[rank], loads, ranks, kElements, kind);
          ASSERT_EQ(plan.edges.size(), static_cast<size_t>(ranks) + 1);
          EXPECT_EQ(plan.edges.front(), 0u);
          EXPECT_EQ(plan.edges.back(), kElements);
          if (rank == 0) first_edges = plan.edges;
          EXPECT_EQ(plan.edges, first_edges) << "rank " << rank << " cut differently";
          const auto& indices = chosen[rank];
          ASSERT_EQ(plan.send_offsets.size(), static_cast<size_t>(ranks) + 1);
          for (int r = 0; r < ranks; ++r) {
            const auto first = std::lower_bound(indices.begin(), indices.end(), plan.edges[r]);
            const auto last = std::lower_bound(indices.begin(), indices.end(), plan.edges[r + 1]);
            EXPECT_EQ(plan.send_counts[r], static_cast<uint64_t>(last - first)) << "slice " << r;
            EXPECT_EQ(plan.send_offsets[r], static_cast<uint64_t>(first - indices.begin())) << "slice " << r;
            owner_loads[r] += plan.send_counts[r];
          }
          EXPECT_EQ(plan.send_offsets.back(), indices.size());
          if (rank == ranks - 1) {
            EXPECT_EQ(owner_loads, plan.partition.loads);
            if (clustered && ranks > 1) {
              if (kind == SlicePartition::balanced) {
                EXPECT_LE(plan.partition.imbalance, 1.2);
              } else {
                EXPECT_GT(plan.partition.imbalance, 1.5);
              }
            }
          }
        }
      }
    }
  }
}

// One allgather of the histograms (rows of bins + 1 words: the collective's invalid-entry count
// after the bins) gives every rank the same loads and edges, and count(s, r) as each rank's own
// plan has it.
TEST(ExchangePlan, AllGatheredHistogramsGiveEveryCount) {
  for (int ranks : {1, 2, 4, 8}) {
    for (SlicePartition kind : {SlicePartition::balanced, SlicePartition::equal}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks");
      const auto chosen = selections(ranks, 20000, true, 11 * ranks);
      std::vector<std::vector<uint64_t>> histograms;
      std::vector<uint64_t> gathered;
      for (const auto& indices : chosen) {
        histograms.push_back(selection_histogram(indices, kElements, kBins));
        gathered.insert(gathered.end(), histograms.back().begin(), histograms.back().end());
        gathered.push_back(0);  // the invalid entries' word
      }
      const std::vector<uint64_t> loads = bin_loads(histograms);
      for (int me = 0; me < ranks; ++me) {
        const ExchangePlan plan = plan_exchange(gathered, kBins + 1, kBins, ranks, me, kElements, kind);
        EXPECT_EQ(plan.loads, loads);
        const SlicePlan own = plan_slices(histograms[me], loads, ranks, kElements, kind);
        EXPECT_EQ(plan.mine.edges, own.edges);
        EXPECT_EQ(plan.mine.send_counts, own.send_counts);
        EXPECT_EQ(plan.mine.send_offsets, own.send_offsets);
        ASSERT_EQ(plan.counts.size(), static_cast<size_t>(ranks) * ranks);
        for (int s = 0; s < ranks; ++s) {
          const SlicePlan theirs = plan_slices(histograms[s], loads, ranks, kElements, kind);
          for (int r = 0; r < ranks; ++r) EXPECT_EQ(plan.counts[s * ranks + r], theirs.send_counts[r]) << s << " " << r;
        }
      }
    }
  }
  const std::vector<uint64_t> short_rows(10, 0);
  EXPECT_THROW(plan_exchange(short_rows, 4, 4, 2, 0, 100, SlicePartition::balanced), std::invalid_argument);
  EXPECT_THROW(plan_exchange(short_rows, 5, 4, 2, 2, 100, SlicePartition::balanced), std::invalid_argument);
}

TEST(SlicePlan, MismatchedBinsAreRefused) {
  const std::vector<uint64_t> histogram(8, 1), loads(16, 1);
  EXPECT_THROW(plan_slices(histogram, loads, 2, 1000, SlicePartition::balanced), std::invalid_argument);
}

TEST(GatherPlan, EachSliceInItsSmallerForm) {
  // Slices of 300, 300, 0, 1000 and 7 elements.
  const std::vector<uint64_t> edges = {0, 300, 600, 600, 1600, 1607};
  const std::vector<uint64_t> nonzero = {99, 100, 0, 0, 7};
  const GatherPlan plan = plan_gather(edges, nonzero);
  // 99 entries: 594 bytes against 600 dense; 100: 600 against 600, a tie goes dense; the empty
  // slice sends nothing; a slice without a nonzero sum sends no entries; 7 of 7: dense, 14 bytes.
  EXPECT_EQ(plan.dense, (std::vector<bool>{false, true, true, false, true}));
  EXPECT_EQ(plan.offsets, (std::vector<uint64_t>{0, 99, 99, 99, 99, 99}));
  EXPECT_EQ(plan.bytes, 594.0 + 600.0 + 0.0 + 0.0 + 14.0);
  EXPECT_EQ(plan.dense_slices, 2);
  EXPECT_EQ(plan.entries, 206u);
  EXPECT_THROW(plan_gather(edges, std::vector<uint64_t>{301, 0, 0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(plan_gather(edges, std::vector<uint64_t>{1, 2}), std::invalid_argument);
}

// Whatever the slices and their counts, the entry slices fit gather_capacity.
TEST(GatherPlan, EntrySlicesFitTheBound) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const int ranks = 1 + static_cast<int>(rng() % 8);
    const uint64_t elements = 1 + rng() % 100000;
    std::vector<uint64_t> edges = {0, elements};
    for (int r = 1; r < ranks; ++r) edges.push_back(rng() % (elements + 1));
    std::sort(edges.begin(), edges.end());
    std::vector<uint64_t> nonzero;
    uint64_t received = 0;
    for (int r = 0; r < ranks; ++r) {
      const uint64_t length = edges[r + 1] - edges[r];
      nonzero.push_back(length == 0 ? 0 : rng() % (length + 1));
      received += nonzero.back() + rng() % 5;  // the entries received bound the nonzero sums
    }
    const GatherPlan plan = plan_gather(edges, nonzero);
    ASSERT_LE(plan.offsets.back(), gather_capacity(elements, received)) << "trial " << trial;
    double smallest = 0;
    for (int r = 0; r < ranks; ++r)
      smallest += static_cast<double>(std::min(2 * (edges[r + 1] - edges[r]), kEntryBytes * nonzero[r]));
    ASSERT_EQ(plan.bytes, smallest) << "trial " << trial;
  }
}

uint32_t magnitude_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits & 0x7FFFFFFFu;
}

TEST(Reselect, CountIsTheCeilingAndAtLeastOne) {
  EXPECT_EQ(reselect_count(0, 0.25), 0u);
  EXPECT_EQ(reselect_count(10, 0.25), 3u);
  EXPECT_EQ(reselect_count(3, 0.01), 1u);
  EXPECT_EQ(reselect_count(7, 1.0), 7u);
  EXPECT_EQ(reselect_count(30, 0.1), 3u);  // not 4: 0.1 * 30 is 3.0000000000000004 in double
  EXPECT_THROW(reselect_count(7, 0.0), std::invalid_argument);
  EXPECT_THROW(reselect_count(7, 1.5), std::invalid_argument);
}

// The threshold both levels give for `magnitudes` and `count`, the histograms built on the host as
// the kernels build them.
uint32_t two_level_threshold(const std::vector<float>& magnitudes, uint64_t count, uint64_t* fine_population) {
  std::vector<uint64_t> coarse_counts(kMagnitudeBins, 0), fine_counts(kMagnitudeBins, 0);
  for (float m : magnitudes) ++coarse_counts[magnitude_bits(m) >> kMagnitudeShift];
  const ReselectLevel coarse = reselect_level(coarse_counts, count);
  ReselectLevel fine{true, 0, 0};
  if (!coarse.keep_all) {
    for (float m : magnitudes) {
      const uint32_t bits = magnitude_bits(m);
      if ((bits >> kMagnitudeShift) == coarse.bin) ++fine_counts[(bits >> kFineShift) & (kMagnitudeBins - 1)];
    }
    fine = reselect_level(fine_counts, count - coarse.above);
  }
  *fine_population = coarse.keep_all ? 0 : fine.keep_all ? coarse_counts[coarse.bin] : fine_counts[fine.bin];
  return reselect_threshold(coarse, fine);
}

// On random magnitudes, spread over many octaves or crowded just above a threshold (as sums of
// top-k selections are), the threshold keeps at least `count` and the largest ones: every kept
// magnitude is >= every dropped one, and the overshoot is less than one fine bin's population.
TEST(Reselect, ThresholdKeepsTheLargestAndAtLeastCount) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 5000;
    std::vector<float> magnitudes(n);
    if (trial % 3 == 0) {  // crowded: the top 5% of a normal distribution, |x| in [1.96, ~4]
      std::normal_distribution<float> normal;
      for (float& m : magnitudes) {
        do m = std::fabs(normal(rng));
        while (m < 1.96f);
      }
    } else {
      std::lognormal_distribution<float> spread(0.0f, 1.0f + static_cast<float>(rng() % 6));
      for (float& m : magnitudes) m = spread(rng);
    }
    if (trial % 7 == 0)  // ties: many equal magnitudes
      for (size_t i = 0; i < n / 2; ++i) magnitudes[i] = 1.0f;
    const uint64_t count = reselect_count(n, 1.0 / static_cast<double>(1 + rng() % 16));
    uint64_t fine_population = 0;
    const uint32_t threshold = two_level_threshold(magnitudes, count, &fine_population);
    uint64_t kept = 0;
    float smallest_kept = INFINITY, largest_dropped = 0;
    for (float m : magnitudes) {
      if (magnitude_bits(m) >= threshold) {
        ++kept;
        smallest_kept = std::min(smallest_kept, m);
      } else {
        largest_dropped = std::max(largest_dropped, m);
      }
    }
    ASSERT_GE(kept, count) << "trial " << trial;
    ASSERT_GE(smallest_kept, largest_dropped) << "trial " << trial;
    if (threshold > 0) {
      ASSERT_LT(kept - count, std::max<uint64_t>(fine_population, 1)) << "trial " << trial;
    } else {
      ASSERT_EQ(kept, n) << "trial " << trial;
    }
    // Without ties, crowded or not, two levels land within a percent of the count.
    if (trial % 7 != 0 && count >= 100) {
      ASSERT_LE(kept, count + count / 100 + 1) << "trial " << trial;
    }
  }
}

TEST(Reselect, LevelsAndThresholdOnAHandMadeHistogram) {
  std::vector<uint64_t> histogram(kMagnitudeBins, 0);
  histogram[1000] = 3;
  histogram[1200] = 2;
  EXPECT_TRUE(reselect_level(histogram, 5).keep_all);
  const ReselectLevel two = reselect_level(histogram, 2);
  EXPECT_FALSE(two.keep_all);
  EXPECT_EQ(two.bin, 1200u);
  EXPECT_EQ(two.above, 0u);
  const ReselectLevel three = reselect_level(histogram, 3);
  EXPECT_EQ(three.bin, 1000u);
  EXPECT_EQ(three.above, 2u);
  std::vector<uint64_t> fine(kMagnitudeBins, 0);
  fine[7] = 1;
  fine[900] = 2;
  const ReselectLevel fine_one = reselect_level(fine, 1);  // one more of bin 1000's three
  EXPECT_EQ(fine_one.bin, 900u);
  EXPECT_EQ(reselect_threshold(three, fine_one), (1000u << kMagnitudeShift) | (900u << kFineShift));
  EXPECT_EQ(reselect_threshold(three, reselect_level(fine, 3)), 1000u << kMagnitudeShift);  // all of bin 1000
  EXPECT_EQ(reselect_threshold(reselect_level(histogram, 9), ReselectLevel{}), 0u);
  EXPECT_THROW(reselect_level(std::vector<uint64_t>(10, 0), 1), std::invalid_argument);
}

TEST(Buckets, RoundTripAndBytes) {
  EXPECT_EQ(bucket_count(0), 0u);
  EXPECT_EQ(bucket_count(1), 1u);
  EXPECT_EQ(bucket_count(65536), 1u);
  EXPECT_EQ(bucket_count(65537), 2u);
  EXPECT_EQ(bucketed_bytes(10, 65537), 48.0);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t begin = rng() % 1000000, length = 1 + rng() % 700000;
    std::set<uint32_t> chosen;
    const size_t k = rng() % 3 == 0 ? 0 : rng() % std::min<uint64_t>(length, 5000);
    while (chosen.size() < k) chosen.insert(static_cast<uint32_t>(begin + rng() % length));
    if (trial % 5 == 0 && length > 2) chosen.insert(static_cast<uint32_t>(begin + length - 1));  // the last element
    const std::vector<uint32_t> indices(chosen.begin(), chosen.end());
    std::vector<uint16_t> low;
    std::vector<uint32_t> counts;
    bucket_encode(indices, begin, begin + length, low, counts);
    ASSERT_EQ(low.size(), indices.size());
    ASSERT_EQ(counts.size(), bucket_count(length));
    ASSERT_EQ(bucket_decode(low, counts, begin), indices) << "trial " << trial;
  }
  std::vector<uint16_t> low;
  std::vector<uint32_t> counts;
  EXPECT_THROW(bucket_encode(std::vector<uint32_t>{5, 5}, 0, 10, low, counts), std::invalid_argument);
  EXPECT_THROW(bucket_encode(std::vector<uint32_t>{10}, 0, 10, low, counts), std::invalid_argument);
  EXPECT_THROW(bucket_decode(std::vector<uint16_t>{1, 2}, std::vector<uint32_t>{1}, 0), std::invalid_argument);
  EXPECT_THROW(bucket_decode(std::vector<uint16_t>{1}, std::vector<uint32_t>{1, 1}, 0), std::invalid_argument);
}

TEST(BusBytes, NcclTestsDefinitions) {
  EXPECT_EQ(allgather_bus_bytes(1200, 4), 900);
  EXPECT_EQ(allreduce_bus_bytes(1200, 4), 1800);
  EXPECT_EQ(allgather_bus_bytes(1200, 1), 0);
  EXPECT_EQ(allreduce_bus_bytes(1200, 1), 0);
}

}  // namespace
}  // namespace fusekit::dp
