// The float64 host reference of error feedback (dp/error_feedback.h), for the tests: one step of
// residual accumulation or momentum correction, given the entries that were selected (the
// selection itself has its own reference, dp/topk_selection_reference.h).
//
//   momentum = 0:   v += g;                 sent = v[selected];  v[selected] = 0
//   momentum m:     u = m u + g;  v += u;   sent = v[selected];  u[selected] = v[selected] = 0
//
// The sent values are the exact accumulated ones; wire rounding is the GPU's business (it keeps the
// remainder in v), so wire value + v on the GPU is compared against the sent values here. Plain
// C++17 (no std::span), so that CUDA tests include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusekit::dp {

struct ErrorFeedbackState {
  std::vector<double> residual;  // v
  std::vector<double> momentum;  // u (unused where the momentum factor is 0)
  explicit ErrorFeedbackState(size_t elements) : residual(elements, 0.0), momentum(elements, 0.0) {}
};

// One step; `selected` are flat indices below the state's size. Returns the accumulated values of
// the selected entries in the order of `selected`. Without `wire_values` a selected entry's
// residual becomes 0 (the value is sent exactly); with them (one per selected entry: what went on
// the wire, e.g. rounded to fp16) it keeps the remainder, residual - wire value, as the GPU's
// error feedback does (dp/error_feedback.h). Throws std::invalid_argument for a size mismatch or an
// index out of range.
std::vector<double> error_feedback_step_reference(ErrorFeedbackState& state, const std::vector<double>& gradient,
                                                  double momentum, const std::vector<uint32_t>& selected,
                                                  const std::vector<double>& wire_values = {});

}  // namespace fusekit::dp
