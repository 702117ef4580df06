// Error feedback for the sparse gradient exchange: per layer, what is not sent stays in a local
// residual and joins the next step's gradient, so a gradient is delayed, never lost. Each step
// selects per layer with dp/topk_selection.h and hands the entries to the collectives
// (dp/sparse_collective.h) as flat uint32 indices and 16-bit wire values.
//
//   residual accumulation (momentum = 0):   v += g;  select top-k of |v| per layer;  v[sel] = 0
//   momentum correction (momentum m > 0,    u = m u + g;  v += u;  select from |v|;
//     Deep Gradient Compression):           u[sel] = v[sel] = 0  (momentum factor masking)
//   a velocity exchanged whole (m > 0,      as above without masking: u keeps going, so the sent
//     MomentumMasking::none):               values add up to the sum of the u's (the exchange of
//                                           Adam's first moment with its second frozen, 1-bit Adam's
//                                           way, dp/gradient_exchanger.h)
//
// Layout: `layers` are (offset, size) spans of one flat buffer, in increasing offset order and not
// overlapping, so the flat indices come out strictly increasing; v and u are fp32 over
// [0, elements), elements = the end of the last layer; the gradient holds fp32, fp16 or bf16.
//
// The non-obvious choice: the selected values leave as 16-bit words, and the rounding remainder
// stays in the residual: v[i] = value - wire(value), which float computes exactly (the two are
// within a factor of two). So a step keeps
//   wire(sent) + v_after == v_before + g        (momentum: v_before + u), element by element,
// exactly, and over steps sum(sent) + v equals the sum of the gradients up to one float rounding of
// each v += g. An fp16 value beyond 65504 is sent as +-65504 and the rest stays in the residual
// (that remainder is rounded); bf16 has fp32's range.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "dp/topk_selection.h"
#include "dp/wire_value.h"
#include "kernels/dtype.h"

namespace fusekit::dp {

// Where momentum correction clears u: at the entries sent (DGC), at those the exchange applied
// (after a re-selection: return_unapplied), or nowhere.
enum class MomentumMasking { on_send, on_apply, none };

class ErrorFeedback {
 public:
  // Allocates v (zeroed), u (zeroed, where momentum > 0) and the outputs for densities up to
  // max_density. Throws std::invalid_argument for layers out of order or overlapping, or a
  // momentum outside [0, 1).
  ErrorFeedback(std::vector<LayerSpan> layers, double max_density, double momentum, WireValue wire);
  ~ErrorFeedback();
  ErrorFeedback(const ErrorFeedback&) = delete;
  ErrorFeedback& operator=(const ErrorFeedback&) = delete;

  // One step at `density` (0 < density <= max_density) on `gradient` (elements of `dtype`, every
  // layer covered); returns the entries selected. Synchronizes with `stream` once (the per-layer
  // counts), then leaves the packing on it. With `second_moment` (AdamW's frozen v over the same
  // flat layout) entries are ranked by the step they would take, |v_residual| / (sqrt(v) + eps)
  // (TopkSelection::select).
  uint64_t step(const void* gradient, kernels::DType dtype, double density, cudaStream_t stream,
                const float* second_moment = nullptr, float eps = 0);

  // After an exchange that applied only some of the last step's entries (the sparse collective's
  // re-selection): v[i] += the wire value of each entry whose exchanged sum[i] (fp32, device, the
  // collective's output) is zero, so an entry that was not applied is delayed, not lost. Then
  //   applied sent + v == the sum of the gradients (up to float rounding), as without it.
  // With MomentumMasking::on_apply (set before the first step), step() leaves u alone and
  // return_unapplied() clears u only where the entry was applied: an entry sent but not applied
  // keeps its velocity, as one never sent does.
  void return_unapplied(const float* sum, cudaStream_t stream);
  void set_masking(MomentumMasking masking) { masking_ = masking; }
  MomentumMasking masking() const { return masking_; }

  // The last step's entries, on the device: flat indices, strictly increasing, and wire values.
  const uint32_t* indices() const { return indices_; }
  const uint16_t* values() const { return values_; }
  uint64_t count() const { return count_; }
  uint64_t capacity() const { return static_cast<uint64_t>(selection_.output_capacity()); }
  const std::vector<LayerSelectionResult>& layer_results() const { return results_; }

  uint64_t elements() const { return elements_; }
  float* residual() const { return residual_; }  // v, device, elements
  float* momentum() const { return momentum_; }  // u, device, elements; nullptr without momentum
  double momentum_factor() const { return momentum_factor_; }
  WireValue wire() const { return wire_; }

 private:
  TopkSelection selection_;
  std::vector<LayerSpan> layers_;
  uint64_t elements_ = 0;
  double momentum_factor_ = 0;
  WireValue wire_;
  float* residual_ = nullptr;
  float* momentum_ = nullptr;
  uint32_t* indices_ = nullptr;
  uint16_t* values_ = nullptr;
  void* pack_table_ = nullptr;  // device: per layer, where its entries come from and go
  uint64_t count_ = 0;
  MomentumMasking masking_ = MomentumMasking::on_send;
  std::vector<LayerSelectionResult> results_;
};

}  // namespace fusekit::dp
