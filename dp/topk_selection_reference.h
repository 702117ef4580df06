// Host references of the top-k selection (topk_selection.h), for the tests: which indices a
// threshold selects, and the exact top k by sorting.
//
// Magnitudes compare in float64. exact_topk breaks ties at the k-th magnitude by the lower index,
// so where the k-th and (k+1)-th magnitudes are equal the GPU's threshold set may differ from it
// in those tied indices only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusekit::dp {

// Over values[0, n): {i : |values[i]| >= threshold}, increasing.
std::vector<uint32_t> select_at_threshold(const float* values, size_t n, float threshold);

// The k indices of largest |values[i]| (ties by lower index), increasing; all of them if k >= n.
std::vector<uint32_t> exact_topk(const float* values, size_t n, size_t k);

}  // namespace fusekit::dp
