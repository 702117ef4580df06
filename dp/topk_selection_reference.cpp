// Host references of the top-k selection (see topk_selection_reference.h).
#include "dp/topk_selection_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace fusekit::dp {

std::vector<uint32_t> select_at_threshold(const float* values, size_t n, float threshold) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(static_cast<double>(values[i])) >= static_cast<double>(threshold))
      out.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

std::vector<uint32_t> exact_topk(const float* values, size_t n, size_t k) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  k = std::min(k, order.size());
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](uint32_t a, uint32_t b) {
        const double ma = std::fabs(static_cast<double>(values[a])), mb = std::fabs(static_cast<double>(values[b]));
        return ma > mb || (ma == mb && a < b);
      });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace fusekit::dp
