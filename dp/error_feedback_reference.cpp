// Error feedback's float64 reference (see error_feedback_reference.h).
#include "dp/error_feedback_reference.h"

#include <stdexcept>
#include <string>

namespace fusekit::dp {

std::vector<double> error_feedback_step_reference(ErrorFeedbackState& state, const std::vector<double>& gradient,
                                                  double momentum, const std::vector<uint32_t>& selected,
                                                  const std::vector<double>& wire_values) {
  const size_t n = state.residual.size();
  if (gradient.size() != n || state.momentum.size() != n)
    throw std::invalid_argument("error feedback reference: a gradient of " + std::to_string(gradient.size()) +
                                " elements for a state of " + std::to_string(n));
  for (size_t i = 0; i < n; ++i) {
    if (momentum > 0) {
      state.momentum[i] = momentum * state.momentum[i] + gradient[i];
      state.residual[i] += state.momentum[i];
    } else {
      state.residual[i] += gradient[i];
    }
  }
  if (!wire_values.empty() && wire_values.size() != selected.size())
    throw std::invalid_argument("error feedback reference: " + std::to_string(wire_values.size()) +
                                " wire values for " + std::to_string(selected.size()) + " selected entries");
  std::vector<double> sent;
  sent.reserve(selected.size());
  for (size_t k = 0; k < selected.size(); ++k) {
    const uint32_t i = selected[k];
    if (i >= n)
      throw std::invalid_argument("error feedback reference: index " + std::to_string(i) + " >= " + std::to_string(n));
    sent.push_back(state.residual[i]);
    state.residual[i] = wire_values.empty() ? 0.0 : state.residual[i] - wire_values[k];
    if (momentum > 0) state.momentum[i] = 0;
  }
  return sent;
}

}  // namespace fusekit::dp
