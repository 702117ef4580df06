// The load balance of the sparse reduce-scatter: which slice of the flat gradient index space each
// of P ranks reduces, so that every rank receives about the same number of entries.
//
// Input: per rank, a histogram of its selected indices over B equal-width bins of the flat index
// space of E elements (bin b holds indices [b * w, (b + 1) * w), w = ceil(E / B)). The load of a
// bin is its count summed over ranks: the entries the reducing rank of that bin receives. Output:
// P + 1 bin edges (0 = edges[0] <= ... <= edges[P] = B), slice r = bins [edges[r], edges[r + 1]),
// the load per slice, and the imbalance max / mean (1 where nothing is selected).
//
// balanced_partition minimises the largest slice load over all cuts on bin edges (binary search
// on the load with a greedy fill), then leaves no slice without bins where B >= P. The bound, with
// mean = total / P and largest = the largest bin's load:
//   max(mean, largest) <= max slice load <= mean + largest,
// so imbalance <= 1 + largest / mean. A single bin holding more than the mean makes imbalance at
// least largest / mean whatever the cut: finer bins (or splitting that bin's index range) are the
// only remedy. equal_partition cuts the index space into equal widths, for comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace fusekit::dp {

struct Partition {
  std::vector<size_t> edges;    // P + 1 bin edges
  std::vector<uint64_t> loads;  // P slice loads (entries received)
  uint64_t total = 0;
  double imbalance = 1.0;  // max load / mean load
};

// The width in elements of each of `bins` bins over `elements` indices.
uint64_t bin_width(uint64_t elements, size_t bins);
// One rank's histogram of its selected flat indices (all below `elements`).
std::vector<uint64_t> selection_histogram(std::span<const uint64_t> indices, uint64_t elements, size_t bins);
// Bin loads summed over ranks; every histogram must have the same number of bins.
std::vector<uint64_t> bin_loads(const std::vector<std::vector<uint64_t>>& rank_histograms);

Partition balanced_partition(std::span<const uint64_t> loads, int ranks);
Partition equal_partition(std::span<const uint64_t> loads, int ranks);
// The slice edges in elements: min(edges[r] * width, elements).
std::vector<uint64_t> element_edges(const Partition& partition, uint64_t elements, size_t bins);

}  // namespace fusekit::dp
