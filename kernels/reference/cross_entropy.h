// Float64 reference of cross-entropy forward and backward (the math and the edge cases are in
// kernels/cross_entropy.h).
#pragma once

#include <cstdint>
#include <vector>

namespace fusekit::reference {

struct CrossEntropyForward {
  std::vector<double> losses, logsumexp;
  double mean = 0;
  int valid_rows = 0;
};

CrossEntropyForward cross_entropy_forward(const std::vector<double>& logits, const std::vector<int64_t>& labels,
                                          int rows, int vocab, int64_t ignore_index, double label_smoothing);

// dlogits for the gradient `dloss` of the mean loss.
std::vector<double> cross_entropy_backward(const std::vector<double>& logits, const std::vector<int64_t>& labels,
                                           int rows, int vocab, int64_t ignore_index, double label_smoothing,
                                           double dloss);

}  // namespace fusekit::reference
