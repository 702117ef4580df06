#include "kernels/reference/token_mean.h"

#include <cstddef>

namespace fusekit::reference {

std::vector<double> token_mean_forward(const std::vector<double>& x, int batch, int tokens, int features) {
  std::vector<double> y(static_cast<size_t>(batch) * features, 0.0);
  for (int b = 0; b < batch; ++b) {
    for (int l = 0; l < tokens; ++l) {
      for (int f = 0; f < features; ++f) {
        y[static_cast<size_t>(b) * features + f] += x[(static_cast<size_t>(b) * tokens + l) * features + f];
      }
    }
  }
  for (double& v : y) v /= tokens;
  return y;
}

std::vector<double> token_mean_backward(const std::vector<double>& dy, int batch, int tokens, int features) {
  std::vector<double> dx(static_cast<size_t>(batch) * tokens * features);
  for (int b = 0; b < batch; ++b) {
    for (int l = 0; l < tokens; ++l) {
      for (int f = 0; f < features; ++f) {
        dx[(static_cast<size_t>(b) * tokens + l) * features + f] = dy[static_cast<size_t>(b) * features + f] / tokens;
      }
    }
  }
  return dx;
}

}  // namespace fusekit::reference
