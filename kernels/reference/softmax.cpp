#include "kernels/reference/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace fusekit::reference {

std::vector<double> softmax_forward(const std::vector<double>& x, int batch, int heads, int queries, int keys,
                                    double scale, const SoftmaxMasks& masks) {
  std::vector<double> y(x.size(), 0.0), z(keys);
  using Kind = SoftmaxMasks::Kind;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int q = 0; q < queries; ++q) {
        const size_t offset = ((static_cast<size_t>(b) * heads + h) * queries + q) * keys;
        double high = -INFINITY;
        for (int k = 0; k < keys; ++k) {
          bool removed = false;
          z[k] = scale * x[offset + k];
          if (masks.kind == Kind::padding) removed = k >= masks.lengths[b];
          if (masks.kind == Kind::causal) removed = k > q + keys - queries;
          if (masks.kind == Kind::bias) {
            z[k] += masks.bias[(static_cast<size_t>(h) * queries + q) * keys + k];
            if (!masks.window_mask.empty()) {
              z[k] += masks.window_mask[(static_cast<size_t>(b % masks.windows) * queries + q) * keys + k];
            }
          }
          if (removed) z[k] = -INFINITY;
          high = std::max(high, z[k]);
        }
        if (high == -INFINITY) continue;  // no key left: the row stays zero
        double sum = 0;
        for (int k = 0; k < keys; ++k) sum += std::exp(z[k] - high);
        for (int k = 0; k < keys; ++k) y[offset + k] = std::exp(z[k] - high) / sum;
      }
    }
  }
  return y;
}

std::vector<double> softmax_backward(const std::vector<double>& y, const std::vector<double>& dy, int rows, int keys,
                                     double scale) {
  std::vector<double> dx(y.size());
  for (int r = 0; r < rows; ++r) {
    const size_t offset = static_cast<size_t>(r) * keys;
    double dot = 0;
    for (int k = 0; k < keys; ++k) dot += y[offset + k] * dy[offset + k];
    for (int k = 0; k < keys; ++k) dx[offset + k] = scale * y[offset + k] * (dy[offset + k] - dot);
  }
  return dx;
}

}  // namespace fusekit::reference
