// The reduce-scatter's load balance (see partition.h for the bound and the layout).
#include "dp/partition.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace fusekit::dp {
namespace {

void check_inputs(std::span<const uint64_t> loads, int ranks) {
  if (ranks < 1) throw std::invalid_argument("partition: ranks must be >= 1, got " + std::to_string(ranks));
  if (loads.empty()) throw std::invalid_argument("partition: no bins");
}

Partition finish(std::span<const uint64_t> loads, std::vector<size_t> edges) {
  Partition p;
  p.edges = std::move(edges);
  const size_t ranks = p.edges.size() - 1;
  for (size_t r = 0; r < ranks; ++r) {
    p.loads.push_back(std::accumulate(loads.begin() + p.edges[r], loads.begin() + p.edges[r + 1], uint64_t{0}));
  }
  p.total = std::accumulate(p.loads.begin(), p.loads.end(), uint64_t{0});
  if (p.total > 0) {
    const double mean = static_cast<double>(p.total) / static_cast<double>(ranks);
    p.imbalance = static_cast<double>(*std::max_element(p.loads.begin(), p.loads.end())) / mean;
  }
  return p;
}

// Whether the bins fit in `ranks` slices of at most `cap` each, filled greedily from the left.
bool fits(std::span<const uint64_t> loads, int ranks, uint64_t cap) {
  int slices = 1;
  uint64_t current = 0;
  for (uint64_t load : loads) {
    if (load > cap) return false;
    if (current + load > cap) {
      if (++slices > ranks) return false;
      current = 0;
    }
    current += load;
  }
  return true;
}

}  // namespace

uint64_t bin_width(uint64_t elements, size_t bins) {
  if (bins == 0) throw std::invalid_argument("partition: no bins");
  return std::max<uint64_t>(1, (elements + bins - 1) / bins);
}

std::vector<uint64_t> selection_histogram(std::span<const uint64_t> indices, uint64_t elements, size_t bins) {
  const uint64_t width = bin_width(elements, bins);
  std::vector<uint64_t> histogram(bins, 0);
  for (uint64_t index : indices) {
    if (index >= elements)
      throw std::invalid_argument("partition: index " + std::to_string(index) + " >= " + std::to_string(elements));
    ++histogram[index / width];
  }
  return histogram;
}

std::vector<uint64_t> bin_loads(const std::vector<std::vector<uint64_t>>& rank_histograms) {
  if (rank_histograms.empty()) throw std::invalid_argument("partition: no histograms");
  std::vector<uint64_t> loads(rank_histograms[0].size(), 0);
  for (const auto& histogram : rank_histograms) {
    if (histogram.size() != loads.size()) throw std::invalid_argument("partition: histograms of different bin counts");
    for (size_t b = 0; b < loads.size(); ++b) loads[b] += histogram[b];
  }
  return loads;
}

Partition balanced_partition(std::span<const uint64_t> loads, int ranks) {
  check_inputs(loads, ranks);
  // The smallest cap for which a greedy fill needs at most `ranks` slices: the optimum over all cuts.
  uint64_t low = *std::max_element(loads.begin(), loads.end());
  uint64_t high = std::accumulate(loads.begin(), loads.end(), uint64_t{0});
  low = std::max(low, (high + ranks - 1) / ranks);
  while (low < high) {
    const uint64_t mid = low + (high - low) / 2;
    if (fits(loads, ranks, mid))
      high = mid;
    else
      low = mid + 1;
  }
  const uint64_t cap = low;
  // Fill again with that cap, cutting early where the bins left are only enough for one each of
  // the slices left, so that no slice is empty where B >= P (a one-bin slice never exceeds cap).
  std::vector<size_t> edges{0};
  uint64_t current = 0;
  const size_t bins = loads.size();
  for (size_t b = 0; b < bins; ++b) {
    const size_t slices_left = static_cast<size_t>(ranks) - (edges.size() - 1);  // including the open one
    const bool open_has_bins = b > edges.back();
    const bool over_cap = current + loads[b] > cap;
    const bool bins_needed_by_rest = bins - b <= slices_left - 1;
    if (open_has_bins && slices_left > 1 && (over_cap || bins_needed_by_rest)) {
      edges.push_back(b);
      current = 0;
    }
    current += loads[b];
  }
  while (edges.size() < static_cast<size_t>(ranks) + 1) edges.push_back(bins);
  return finish(loads, std::move(edges));
}

Partition equal_partition(std::span<const uint64_t> loads, int ranks) {
  check_inputs(loads, ranks);
  std::vector<size_t> edges;
  for (int r = 0; r <= ranks; ++r) edges.push_back(loads.size() * static_cast<size_t>(r) / static_cast<size_t>(ranks));
  return finish(loads, std::move(edges));
}

std::vector<uint64_t> element_edges(const Partition& partition, uint64_t elements, size_t bins) {
  const uint64_t width = bin_width(elements, bins);
  std::vector<uint64_t> out;
  for (size_t edge : partition.edges) out.push_back(std::min<uint64_t>(edge * width, elements));
  return out;
}

}  // namespace fusekit::dp
