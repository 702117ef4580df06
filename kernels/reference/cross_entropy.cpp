#include "kernels/reference/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fusekit::reference {
namespace {

// log sum exp of a row, shifted by its maximum; -inf entries contribute nothing, and a row of
// -inf only has -inf.
double logsumexp(const double* x, int vocab) {
  const double max = *std::max_element(x, x + vocab);
  if (max == -std::numeric_limits<double>::infinity()) return max;
  double sum = 0;
  for (int c = 0; c < vocab; ++c) sum += std::exp(x[c] - max);
  return max + std::log(sum);
}

}  // namespace

CrossEntropyForward cross_entropy_forward(const std::vector<double>& logits, const std::vector<int64_t>& labels,
                                          int rows, int vocab, int64_t ignore_index, double label_smoothing) {
  CrossEntropyForward out{std::vector<double>(rows), std::vector<double>(rows)};
  double sum = 0;
  for (int r = 0; r < rows; ++r) {
    const double* x = &logits[static_cast<size_t>(r) * vocab];
    const double lse = logsumexp(x, vocab);
    out.logsumexp[r] = lse;
    const int64_t label = labels[r];
    if (label == ignore_index) continue;
    ++out.valid_rows;
    if (label < 0 || label >= vocab) {
      out.losses[r] = std::nan("");
    } else {
      // sum_c target_c * (lse - x_c), target = (1 - eps) * onehot + eps / V; the smoothing part only
      // where eps > 0 (0 * inf is NaN, and PyTorch leaves it out too).
      double loss = (1 - label_smoothing) * (lse - x[label]);
      if (label_smoothing > 0) {
        double smooth = 0;
        for (int c = 0; c < vocab; ++c) smooth += lse - x[c];
        loss += label_smoothing / vocab * smooth;
      }
      out.losses[r] = loss;
    }
    sum += out.losses[r];
  }
  out.mean = out.valid_rows > 0 ? sum / out.valid_rows : 0.0;
  return out;
}

std::vector<double> cross_entropy_backward(const std::vector<double>& logits, const std::vector<int64_t>& labels,
                                           int rows, int vocab, int64_t ignore_index, double label_smoothing,
                                           double dloss) {
  const CrossEntropyForward f = cross_entropy_forward(logits, labels, rows, vocab, ignore_index, label_smoothing);
  std::vector<double> dlogits(logits.size(), 0.0);
  if (f.valid_rows == 0) return dlogits;
  const double scale = dloss / f.valid_rows;
  for (int r = 0; r < rows; ++r) {
    const int64_t label = labels[r];
    if (label == ignore_index) continue;
    const size_t offset = static_cast<size_t>(r) * vocab;
    const bool in_range = label >= 0 && label < vocab;
    for (int c = 0; c < vocab; ++c) {
      const double target = (c == label ? 1 - label_smoothing : 0.0) + label_smoothing / vocab;
      const double softmax = std::exp(logits[offset + c] - f.logsumexp[r]);
      dlogits[offset + c] = in_range ? (softmax - target) * scale : std::nan("");
    }
  }
  return dlogits;
}

}  // namespace fusekit::reference
