// Data-parallel gradient exchange for a model's flat gradient buffer (models/gradient_exchange.h):
// every rank ends a step with the same summed gradients, by one of
//
//   dense               ncclAllReduce (sum) of the flat buffer in its own dtype (fp16/bf16): the
//                       baseline the literature says to compare with, not an fp32 allreduce.
//   sparse              error feedback (dp/error_feedback.h: residual + gradient, top-k per
//                       tensor at the step's density, the rest kept for later steps), then the
//                       sparse collective (dp/sparse_collective.h: balanced or equal-slice reduce-
//                       scatter + allgather, or the plain allgather) into an fp32 sum, narrowed
//                       back into the gradient buffer (entries no rank sent are zero).
//   auto                the first `probe_steps` steps exchange densely and also run the sparse path
//                       on a copy of the same gradients (its result thrown away); from then on the
//                       exchange whose median time was lower, and `decision()` says which and why.
//
// Re-selection (`reselect` < 1, the reduce-scatter collectives): after the reduce-scatter, each
// slice's owner keeps only that fraction of its sums, the largest (a global top-k by slices, as
// gTop-k and Ok-Topk do), so the allgather phase carries about that fraction of the entries; each
// rank's entries that were not kept go back into its residual. With P ranks and little overlap
// between their selections, 1/P gathers about as many entries as one rank selected.
//
// Density warm-up (Deep Gradient Compression): a step's density falls from `warmup_start` to
// `density` over `warmup_steps` sparse steps (dp/policy.h's warmup_density). Every tensor is a
// layer of the selection, so no tensor is starved (each sends at least one entry).
//
// Dense steps first (`dense_steps`, sparse mode): the first exchanges are dense allreduces, the
// optimizer's warm-up before sparsification.
//
// Frozen variance (`frozen_variance`, sparse mode, after at least one dense step; 1-bit Adam's
// recipe with top-k in place of 1-bit signs): AdamW on error-feedback gradients falls behind,
// because a coordinate sent once every k steps arrives as one sum of k gradients, which Adam's
// second moment sees as one large gradient (about sqrt(k) times too small a step). So after the
// dense steps each rank keeps its own velocity u = momentum u + g (momentum: AdamW's beta1), the
// error feedback sends top-k of the velocity's unsent remainder with no momentum masking (so what
// is sent adds up to the sum of the velocities), and the optimizer takes AdamW's step with the
// second moment frozen at the end of the dense steps (kernels/adamw.h's step_frozen_variance,
// which velocity_factor() asks for): with v fixed the update is linear in the velocity (below the
// step's cap, frozen_max_step() x lr per coordinate), so delay is all that error feedback costs, as
// for SGD with momentum. The cap is 1 / (density x reselect) by default: a coordinate sent once in
// that many steps arrives with that many steps' velocity, which a cap of one AdamW step (lr) would
// cut down to one step's worth.
//
// Ranking by the step (`rank_by_step`, with frozen_variance): with v frozen, coordinate i's
// unsent velocity r_i would move its weight by lr r_i / (sqrt(v_i) + eps), so the selection ranks
// entries by that (TopkSelection::select's second_moment, v from FlatGradients::second_moment)
// instead of by |r_i|, which lets coordinates with small gradients wait for many steps' velocity
// while those with large ones go out after one: the same bytes, the delay evened out where it
// moves the weights. An option to measure against the plain ranking.
//
// Timing: events on the model's stream split each exchange into selection (residual update,
// threshold, compaction), communication (every NCCL call and the host waits between them) and
// narrowing; `last()` reads them once the step's stream has completed (the caller synchronizes).
//
// The non-obvious choice: the gradients hold loss_scale x the true ones and the residual keeps
// them in those units; that is right only for a static loss scale (models/bert_model.h's), which
// is why no dynamic scaler is offered here. A non-finite gradient (an fp16 overflow) would stay in
// the residual for good, so `last()` counts non-finite sums (the optimizer skips such a step) and
// the caller stops: with fp16, take a loss scale that does not overflow; bf16 needs none.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "dp/communicator.h"
#include "dp/error_feedback.h"
#include "dp/sparse_collective.h"
#include "models/gradient_exchange.h"

namespace fusekit::dp {

enum class ExchangeMode { dense, sparse, automatic };
enum class SparseCollectiveKind { balanced, equal, allgather };

const char* exchange_mode_name(ExchangeMode mode);            // "dense", "sparse", "auto"
const char* collective_kind_name(SparseCollectiveKind kind);  // "balanced", "equal", "allgather"
ExchangeMode parse_exchange_mode(const std::string& name);    // std::invalid_argument otherwise
SparseCollectiveKind parse_collective_kind(const std::string& name);

struct ExchangerOptions {
  ExchangeMode mode = ExchangeMode::dense;
  SparseCollectiveKind collective = SparseCollectiveKind::balanced;
  double density = 0.01;  // (0, 1]
  int64_t warmup_steps = 0;
  double warmup_start = 0.25;               // the density of step 0 where warmup_steps > 0
  double momentum = 0;                      // DGC's momentum correction (0: residual accumulation alone)
  double reselect = 1;                      // < 1: each slice owner keeps that fraction of its sums (balanced, equal)
  int64_t dense_steps = 0;                  // sparse: the first steps exchange densely
  bool frozen_variance = false;             // sparse, after dense steps: exchange velocities (see above)
  double frozen_max_step = 0;               // its cap in units of lr: 0 = 1 / (density x reselect); inf: none
  bool rank_by_step = false;                // frozen_variance: rank by |r| / (sqrt(v) + eps), below
  IndexForm index_form = IndexForm::plain;  // how the reduce-scatter collectives send indices
  int probe_steps = 5;                      // auto: steps that time both exchanges
};

// One exchange, measured.
struct ExchangeRecord {
  bool sparse = false;
  double density = 0;       // the step's (0 for dense)
  uint64_t entries = 0;     // this rank's selected entries
  double selection_ms = 0;  // error feedback + selection + packing
  double communication_ms = 0;
  double narrow_ms = 0;
  double probe_ms = 0;        // auto's probe of the other exchange, this step
  uint64_t nonfinite = 0;     // non-finite values in the exchanged gradients (sparse: in the sum)
  ExchangeStats stats;        // bytes sent by this rank, loads
  ExchangeStats probe_stats;  // auto's probe of the sparse exchange, this step
};

class GradientExchanger final : public models::GradientExchange {
 public:
  // For gradients laid out as `layout` (its data pointer is not kept). Allocates the residual, the
  // outputs and the collective's workspace for the largest density the schedule reaches.
  GradientExchanger(Communicator& communicator, const models::FlatGradients& layout, const ExchangerOptions& options);
  ~GradientExchanger() override;
  GradientExchanger(const GradientExchanger&) = delete;
  GradientExchanger& operator=(const GradientExchanger&) = delete;

  float exchange(const models::FlatGradients& gradients, cudaStream_t stream) override;
  // The momentum factor after a sparse exchange of velocities (frozen_variance), else 0.
  double velocity_factor() const override { return velocities_ ? options_.momentum : 0; }
  double frozen_max_step() const override;

  // The last exchange; its times need the stream it ran on to have completed.
  ExchangeRecord last();
  int64_t steps() const { return step_; }
  // auto: empty until the probe steps are over, then one line; dense or sparse: the mode.
  const std::string& decision() const { return decision_; }
  bool sparse_now() const;
  // The error-feedback residual (device, fp32, residual_elements() long: up to the end of the last
  // tensor, so the flat buffer's padding after it has none); nullptr and 0 for dense.
  const float* residual() const { return feedback_ ? feedback_->residual() : nullptr; }
  uint64_t residual_elements() const { return feedback_ ? feedback_->elements() : 0; }

 private:
  void run_sparse(const void* source, void* target, double density, cudaStream_t stream);
  void run_dense(void* gradients, cudaStream_t stream);
  void decide(cudaStream_t stream);
  double density_of(int64_t step) const;

  Communicator& communicator_;
  ExchangerOptions options_;
  models::FlatGradients layout_;
  std::unique_ptr<ErrorFeedback> feedback_;
  std::unique_ptr<SparseCollective> collective_;
  float* sum_ = nullptr;        // fp32, elements: the sparse collective's result
  void* probe_copy_ = nullptr;  // auto: the gradients the probe's sparse path reads
  cudaEvent_t events_[6] = {};
  unsigned long long* nonfinite_ = nullptr;  // device: the narrowing's count
  bool ran_sparse_ = false, ran_dense_ = false;
  bool velocities_ = false;  // the last exchange left velocity increments (frozen_variance)
  ExchangeRecord record_;
  const float* second_moment_ = nullptr;  // this exchange's, where rank_by_step
  float eps_ = 0;
  int64_t step_ = 0;
  std::vector<double> probe_dense_ms_, probe_sparse_ms_;
  int chosen_ = -1;  // auto: -1 probing, 0 dense, 1 sparse
  std::string decision_;
};

}  // namespace fusekit::dp
