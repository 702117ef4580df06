// Float64 reference of scale, mask and softmax, forward and backward (the math and the masks are in
// kernels/softmax.h): y = softmax(scale * x + bias terms) over the keys with removed keys at -inf,
// and zeros for a row that keeps no key.
#pragma once

#include <vector>

namespace fusekit::reference {

struct SoftmaxMasks {
  enum class Kind { none, padding, causal, bias };
  Kind kind = Kind::none;
  std::vector<int> lengths;         // padding: [batch]
  std::vector<double> bias;         // bias: [heads, queries, keys]
  std::vector<double> window_mask;  // bias, may be empty: [windows, queries, keys]
  int windows = 0;
};

// x: [batch, heads, queries, keys]; returns y of the same layout.
std::vector<double> softmax_forward(const std::vector<double>& x, int batch, int heads, int queries, int keys,
                                    double scale, const SoftmaxMasks& masks);

// y, dy: [rows, keys]; returns dx = scale * y * (dy - sum_k dy * y).
std::vector<double> softmax_backward(const std::vector<double>& y, const std::vector<double>& dy, int rows, int keys,
                                     double scale);

}  // namespace fusekit::reference
