// The sparse reduce-scatter's host bookkeeping (see slice_plan.h).
#include "dp/slice_plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace fusekit::dp {

SlicePlan plan_slices(std::span<const uint64_t> own_histogram, std::span<const uint64_t> loads, int ranks,
                      uint64_t elements, SlicePartition kind) {
  if (own_histogram.size() != loads.size())
    throw std::invalid_argument("slice plan: a histogram of " + std::to_string(own_histogram.size()) +
                                " bins against loads of " + std::to_string(loads.size()));
  SlicePlan plan;
  plan.partition = kind == SlicePartition::balanced ? balanced_partition(loads, ranks) : equal_partition(loads, ranks);
  plan.edges = element_edges(plan.partition, elements, loads.size());
  plan.send_offsets.push_back(0);
  for (int r = 0; r < ranks; ++r) {
    uint64_t count = 0;
    for (size_t b = plan.partition.edges[r]; b < plan.partition.edges[r + 1]; ++b) count += own_histogram[b];
    plan.send_counts.push_back(count);
    plan.send_offsets.push_back(plan.send_offsets.back() + count);
  }
  return plan;
}

ExchangePlan plan_exchange(std::span<const uint64_t> histograms, size_t stride, size_t bins, int ranks, int me,
                           uint64_t elements, SlicePartition kind) {
  if (ranks < 1 || me < 0 || me >= ranks || stride < bins || histograms.size() != static_cast<size_t>(ranks) * stride) {
    throw std::invalid_argument("exchange plan: " + std::to_string(histograms.size()) + " words for " +
                                std::to_string(ranks) + " ranks of " + std::to_string(stride) + " (bins " +
                                std::to_string(bins) + ", rank " + std::to_string(me) + ")");
  }
  auto row = [&](int s) { return histograms.subspan(static_cast<size_t>(s) * stride, bins); };
  ExchangePlan plan;
  plan.loads.assign(bins, 0);
  for (int s = 0; s < ranks; ++s) {
    const auto h = row(s);
    for (size_t b = 0; b < bins; ++b) plan.loads[b] += h[b];
  }
  // The partition depends on the loads alone: made once, for this rank; the others' counts are
  // their bins summed between the same bin edges.
  plan.mine = plan_slices(row(me), plan.loads, ranks, elements, kind);
  const std::vector<size_t>& bin_edges = plan.mine.partition.edges;
  plan.counts.assign(static_cast<size_t>(ranks) * ranks, 0);
  for (int s = 0; s < ranks; ++s) {
    const auto h = row(s);
    for (int r = 0; r < ranks; ++r) {
      uint64_t& count = plan.counts[static_cast<size_t>(s) * ranks + r];
      for (size_t b = bin_edges[r]; b < bin_edges[r + 1]; ++b) count += h[b];
    }
  }
  return plan;
}

GatherPlan plan_gather(std::span<const uint64_t> edges, std::span<const uint64_t> nonzero) {
  if (edges.size() != nonzero.size() + 1)
    throw std::invalid_argument("gather plan: " + std::to_string(edges.size()) + " edges for " +
                                std::to_string(nonzero.size()) + " slices");
  GatherPlan plan;
  plan.offsets.push_back(0);
  for (size_t r = 0; r < nonzero.size(); ++r) {
    const uint64_t length = edges[r + 1] - edges[r];
    if (nonzero[r] > length)
      throw std::invalid_argument("gather plan: slice " + std::to_string(r) + " has " + std::to_string(nonzero[r]) +
                                  " nonzero sums in " + std::to_string(length) + " elements");
    const bool dense = kEntryBytes * nonzero[r] >= 2 * length;  // 2-byte words against 6-byte entries
    plan.dense.push_back(dense);
    plan.offsets.push_back(plan.offsets.back() + (dense ? 0 : nonzero[r]));
    plan.bytes += static_cast<double>(dense ? 2 * length : kEntryBytes * nonzero[r]);
    plan.dense_slices += dense && length > 0 ? 1 : 0;
    plan.entries += nonzero[r];
  }
  return plan;
}

uint64_t gather_capacity(uint64_t elements, uint64_t received) { return std::min(elements / 3 + 1, received); }

uint64_t reselect_count(uint64_t nonzero, double keep) {
  if (!(keep > 0 && keep <= 1))
    throw std::invalid_argument("re-selection: keep must be in (0, 1], not " + std::to_string(keep));
  if (nonzero == 0) return 0;
  // ceil without the product's rounding error deciding it (0.1 * 30 is 3.0000000000000004).
  const double k = std::ceil(keep * static_cast<double>(nonzero) * (1 - 1e-12));
  return k < 1 ? 1 : k >= static_cast<double>(nonzero) ? nonzero : static_cast<uint64_t>(k);
}

ReselectLevel reselect_level(std::span<const uint64_t> histogram, uint64_t count) {
  if (histogram.size() != static_cast<size_t>(kMagnitudeBins))
    throw std::invalid_argument("re-selection: the histogram must have " + std::to_string(kMagnitudeBins) + " bins");
  uint64_t total = 0;
  for (uint64_t c : histogram) total += c;
  if (total <= count) return {true, 0, 0};
  uint64_t above = 0;
  for (int b = kMagnitudeBins - 1; b > 0; --b) {
    if (above + histogram[b] >= count) return {false, static_cast<uint32_t>(b), above};
    above += histogram[b];
  }
  return {false, 0, above};
}

uint32_t reselect_threshold(const ReselectLevel& coarse, const ReselectLevel& fine) {
  if (coarse.keep_all) return 0;
  return (coarse.bin << kMagnitudeShift) | (fine.keep_all ? 0u : fine.bin << kFineShift);
}

uint64_t bucket_count(uint64_t length) { return (length + (uint64_t{1} << kBucketShift) - 1) >> kBucketShift; }

double bucketed_bytes(uint64_t entries, uint64_t length) {
  return 4.0 * static_cast<double>(entries) + 4.0 * static_cast<double>(bucket_count(length));
}

void bucket_encode(std::span<const uint32_t> indices, uint64_t begin, uint64_t end, std::vector<uint16_t>& low,
                   std::vector<uint32_t>& counts) {
  low.clear();
  counts.assign(bucket_count(end - begin), 0);
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < begin || indices[i] >= end || (i > 0 && indices[i] <= indices[i - 1]))
      throw std::invalid_argument("bucket encoding: index " + std::to_string(indices[i]) + " at position " +
                                  std::to_string(i) + " is out of order or outside [" + std::to_string(begin) + ", " +
                                  std::to_string(end) + ")");
    const uint64_t local = indices[i] - begin;
    low.push_back(static_cast<uint16_t>(local & 0xFFFFu));
    ++counts[local >> kBucketShift];
  }
}

std::vector<uint32_t> bucket_decode(std::span<const uint16_t> low, std::span<const uint32_t> counts, uint64_t begin) {
  uint64_t total = 0;
  for (uint32_t c : counts) total += c;
  if (total != low.size())
    throw std::invalid_argument("bucket decoding: the counts cover " + std::to_string(total) + " entries, " +
                                std::to_string(low.size()) + " were sent");
  std::vector<uint32_t> indices;
  size_t j = 0;
  for (size_t b = 0; b < counts.size(); ++b) {
    for (uint32_t n = 0; n < counts[b]; ++n, ++j) {
      indices.push_back(static_cast<uint32_t>(begin + (static_cast<uint64_t>(b) << kBucketShift) + low[j]));
    }
  }
  return indices;
}

double allgather_bus_bytes(double bytes, int ranks) { return bytes * (ranks - 1) / ranks; }
double allreduce_bus_bytes(double bytes, int ranks) { return 2 * bytes * (ranks - 1) / ranks; }

}  // namespace fusekit::dp
