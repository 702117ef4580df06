// The data-parallel gradient exchange (see gradient_exchanger.h).
#include "dp/gradient_exchanger.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "dp/detail/sparse_collective_kernels.h"
#include "dp/nccl_check.h"
#include "dp/policy.h"
#include "kernels/cuda_check.h"
#include "profiler/range.h"

namespace fusekit::dp {
namespace {

enum Event { kStart, kSelected, kCommunicated, kNarrowed, kDenseStart, kDenseEnd, kEvents };

double elapsed_ms(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0.f;
  FUSEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return ms;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

WireValue wire_of(kernels::DType dtype) {
  // fp32 gradients travel as bf16 (fp32's range); fp16 ones as fp16.
  return dtype == kernels::DType::f16 ? WireValue::f16 : WireValue::bf16;
}

std::vector<LayerSpan> spans_of(const models::FlatGradients& layout) {
  std::vector<LayerSpan> spans;
  for (const auto& t : layout.tensors) {
    if (t.size == 0) continue;
    spans.push_back({static_cast<int64_t>(t.offset), static_cast<int64_t>(t.size)});
  }
  if (spans.empty()) throw std::invalid_argument("gradient exchange: the gradients hold no tensor");
  return spans;
}

}  // namespace

const char* exchange_mode_name(ExchangeMode mode) {
  switch (mode) {
    case ExchangeMode::dense:
      return "dense";
    case ExchangeMode::sparse:
      return "sparse";
    case ExchangeMode::automatic:
      return "auto";
  }
  return "?";
}

const char* collective_kind_name(SparseCollectiveKind kind) {
  switch (kind) {
    case SparseCollectiveKind::balanced:
      return "balanced";
    case SparseCollectiveKind::equal:
      return "equal";
    case SparseCollectiveKind::allgather:
      return "allgather";
  }
  return "?";
}

ExchangeMode parse_exchange_mode(const std::string& name) {
  for (ExchangeMode m : {ExchangeMode::dense, ExchangeMode::sparse, ExchangeMode::automatic}) {
    if (name == exchange_mode_name(m)) return m;
  }
  throw std::invalid_argument("unknown exchange '" + name + "' (dense, sparse or auto)");
}

SparseCollectiveKind parse_collective_kind(const std::string& name) {
  for (SparseCollectiveKind k :
       {SparseCollectiveKind::balanced, SparseCollectiveKind::equal, SparseCollectiveKind::allgather}) {
    if (name == collective_kind_name(k)) return k;
  }
  throw std::invalid_argument("unknown sparse collective '" + name + "' (balanced, equal or allgather)");
}

GradientExchanger::GradientExchanger(Communicator& communicator, const models::FlatGradients& layout,
                                     const ExchangerOptions& options)
    : communicator_(communicator), options_(options), layout_(layout) {
  layout_.data = nullptr;
  if (!(options_.density > 0 && options_.density <= 1)) {
    throw std::invalid_argument("gradient exchange: the density must be in (0, 1], not " +
                                std::to_string(options_.density));
  }
  if (options_.warmup_steps > 0 && !(options_.warmup_start > 0 && options_.warmup_start <= 1)) {
    throw std::invalid_argument("gradient exchange: the warm-up's first density must be in (0, 1]");
  }
  if (options_.mode == ExchangeMode::automatic && options_.probe_steps < 1) {
    throw std::invalid_argument("gradient exchange: auto needs at least one probe step");
  }
  if (!(options_.reselect > 0 && options_.reselect <= 1)) {
    throw std::invalid_argument("gradient exchange: the re-selection's kept fraction must be in (0, 1], not " +
                                std::to_string(options_.reselect));
  }
  if (options_.dense_steps < 0) throw std::invalid_argument("gradient exchange: dense steps must be >= 0");
  if (options_.dense_steps > 0 && options_.mode != ExchangeMode::sparse) {
    throw std::invalid_argument("gradient exchange: dense steps first are for the sparse exchange");
  }
  if (options_.frozen_variance &&
      (options_.mode != ExchangeMode::sparse || options_.dense_steps < 1 || !(options_.momentum > 0))) {
    throw std::invalid_argument(
        "gradient exchange: frozen variance needs the sparse exchange, at least one dense step first (AdamW's "
        "second moment comes from them) and a momentum in (0, 1) (AdamW's beta1)");
  }
  if (!(options_.frozen_max_step == 0 || options_.frozen_max_step >= 1)) {
    throw std::invalid_argument("gradient exchange: the frozen step's cap must be 0 (automatic) or >= 1 lr, not " +
                                std::to_string(options_.frozen_max_step));
  }
  if (options_.rank_by_step && !options_.frozen_variance) {
    throw std::invalid_argument("gradient exchange: ranking by the step needs the frozen variance (its v)");
  }
  if (options_.rank_by_step && options_.reselect < 1) {
    throw std::invalid_argument(
        "gradient exchange: ranking by the step does not go with re-selection (the slice owners keep the largest "
        "sums, not the largest steps)");
  }
  if (options_.reselect < 1 && options_.collective == SparseCollectiveKind::allgather) {
    throw std::invalid_argument("gradient exchange: re-selection needs a reduce-scatter collective (balanced, equal)");
  }
  for (auto& e : events_) FUSEKIT_CUDA_CHECK(cudaEventCreate(&e));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&nonfinite_, sizeof(unsigned long long)));
  if (options_.mode == ExchangeMode::automatic && communicator_.size() == 1) {
    chosen_ = 0;
    decision_ = "auto: dense (one rank: nothing to exchange)";
  }
  const bool needs_sparse = options_.mode == ExchangeMode::sparse || chosen_ < 0;
  if (options_.mode == ExchangeMode::dense) decision_ = "dense: ncclAllReduce of the flat gradients";
  if (options_.mode == ExchangeMode::sparse) {
    decision_ = std::string("sparse: top-k at density ") + std::to_string(options_.density) + ", " +
                collective_kind_name(options_.collective) + " collective";
  }
  if (!needs_sparse) return;
  const double max_density =
      options_.warmup_steps > 0 ? std::max(options_.density, options_.warmup_start) : options_.density;
  feedback_ =
      std::make_unique<ErrorFeedback>(spans_of(layout_), max_density, options_.momentum, wire_of(layout_.dtype));
  // Velocities are exchanged whole (never masked); DGC's masking clears u where an entry was sent,
  // or after a re-selection only where it was applied.
  feedback_->set_masking(options_.frozen_variance ? MomentumMasking::none
                         : options_.reselect < 1  ? MomentumMasking::on_apply
                                                  : MomentumMasking::on_send);
  // The selection's capacity allows counts up to 1.25 k per tensor; no rank sends more than all.
  collective_ = std::make_unique<SparseCollective>(communicator_, layout_.elements,
                                                   std::min<uint64_t>(feedback_->capacity(), layout_.elements),
                                                   wire_of(layout_.dtype), 4096, options_.index_form);
  FUSEKIT_CUDA_CHECK(cudaMalloc(&sum_, layout_.elements * sizeof(float)));
  if (chosen_ < 0) {
    FUSEKIT_CUDA_CHECK(cudaMalloc(&probe_copy_, layout_.elements * kernels::dtype_size(layout_.dtype)));
  }
}

GradientExchanger::~GradientExchanger() {
  cudaStreamSynchronize(communicator_.stream());
  for (auto& e : events_) cudaEventDestroy(e);
  cudaFree(nonfinite_);
  cudaFree(sum_);
  cudaFree(probe_copy_);
}

double GradientExchanger::density_of(int64_t step) const {
  if (options_.warmup_steps <= 0) return options_.density;
  return warmup_density(step - options_.dense_steps, options_.warmup_steps, options_.warmup_start, options_.density);
}

double GradientExchanger::frozen_max_step() const {
  if (options_.frozen_max_step > 0) return options_.frozen_max_step;
  const double landed = record_.density * options_.reselect;  // the fraction of coordinates a step updates
  return landed > 0 ? std::max(1.0, 1.0 / landed) : 1.0;
}

bool GradientExchanger::sparse_now() const {
  return options_.mode == ExchangeMode::sparse || (options_.mode == ExchangeMode::automatic && chosen_ == 1);
}

void GradientExchanger::run_sparse(const void* source, void* target, double density, cudaStream_t stream) {
  record_.sparse = true;
  record_.density = density;
  {
    profiler::ScopedRange range("dp.select");
    record_.entries = feedback_->step(source, layout_.dtype, density, stream, second_moment_, eps_);
  }
  FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kSelected], stream));
  const cudaStream_t comm = communicator_.stream();
  FUSEKIT_CUDA_CHECK(cudaStreamWaitEvent(comm, events_[kSelected]));
  const SparseEntries mine{feedback_->indices(), feedback_->values(), feedback_->count()};
  switch (options_.collective) {
    case SparseCollectiveKind::balanced:
      record_.stats = collective_->reduce_scatter_allgather(mine, sum_, SlicePartition::balanced, options_.reselect);
      break;
    case SparseCollectiveKind::equal:
      record_.stats = collective_->reduce_scatter_allgather(mine, sum_, SlicePartition::equal, options_.reselect);
      break;
    case SparseCollectiveKind::allgather:
      record_.stats = collective_->allgather(mine, sum_);
      break;
  }
  FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kCommunicated], comm));
  FUSEKIT_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[kCommunicated]));
  profiler::ScopedRange range("dp.narrow");
  if (options_.reselect < 1) feedback_->return_unapplied(sum_, stream);  // what re-selection left out
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(nonfinite_, 0, sizeof(unsigned long long), stream));
  detail::narrow(sum_, layout_.elements, layout_.dtype, target, nonfinite_, stream);
  FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kNarrowed], stream));
}

void GradientExchanger::run_dense(void* gradients, cudaStream_t stream) {
  FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kDenseStart], stream));
  const cudaStream_t comm = communicator_.stream();
  FUSEKIT_CUDA_CHECK(cudaStreamWaitEvent(comm, events_[kDenseStart]));
  ExchangeStats stats = dense_allreduce(communicator_, gradients, layout_.elements, layout_.dtype);
  FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kDenseEnd], comm));
  FUSEKIT_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[kDenseEnd]));
  record_.stats = std::move(stats);
}

float GradientExchanger::exchange(const models::FlatGradients& gradients, cudaStream_t stream) {
  if (gradients.elements != layout_.elements || gradients.dtype != layout_.dtype) {
    throw std::invalid_argument("gradient exchange: the gradients' layout changed after construction");
  }
  const int64_t step = step_++;
  record_ = ExchangeRecord{};
  ran_sparse_ = ran_dense_ = velocities_ = false;
  FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kStart], stream));
  if (options_.mode == ExchangeMode::automatic && chosen_ < 0) {
    // Probe: the sparse path on a copy (its sum thrown away), then the dense exchange for real.
    FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(probe_copy_, gradients.data,
                                       layout_.elements * kernels::dtype_size(layout_.dtype), cudaMemcpyDeviceToDevice,
                                       stream));
    FUSEKIT_CUDA_CHECK(cudaEventRecord(events_[kStart], stream));
    run_sparse(probe_copy_, probe_copy_, options_.density, stream);
    const ExchangeStats sparse_stats = record_.stats;
    run_dense(gradients.data, stream);
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(events_[kDenseEnd]));
    const double sparse_ms = elapsed_ms(events_[kStart], events_[kNarrowed]);
    const double dense_ms = elapsed_ms(events_[kDenseStart], events_[kDenseEnd]);
    probe_sparse_ms_.push_back(sparse_ms);
    probe_dense_ms_.push_back(dense_ms);
    record_.sparse = false;
    record_.density = 0;
    ran_dense_ = true;
    record_.probe_ms = sparse_ms;
    record_.probe_stats = sparse_stats;
    if (static_cast<int>(probe_dense_ms_.size()) == options_.probe_steps) decide(stream);
    return static_cast<float>(communicator_.size());
  }
  if (sparse_now() && step >= options_.dense_steps) {
    second_moment_ = nullptr;
    if (options_.rank_by_step) {
      if (gradients.second_moment == nullptr || !(gradients.eps > 0)) {
        throw std::invalid_argument("gradient exchange: ranking by the step needs the model's AdamW second moment");
      }
      // AdamW's denominator is sqrt(v) / sqrt(1 - beta2^T) + eps, T the AdamW steps (the dense ones):
      // ranking by |r| / (sqrt(v) + eps sqrt(1 - beta2^T)) orders entries as their steps.
      second_moment_ = gradients.second_moment;
      eps_ = static_cast<float>(gradients.eps *
                                std::sqrt(1 - std::pow(gradients.beta2, static_cast<double>(options_.dense_steps))));
    }
    run_sparse(gradients.data, gradients.data, density_of(step), stream);
    ran_sparse_ = true;
    velocities_ = options_.frozen_variance;
  } else {
    run_dense(gradients.data, stream);
    ran_dense_ = true;
  }
  return static_cast<float>(communicator_.size());
}

void GradientExchanger::decide(cudaStream_t stream) {
  // Every rank must take the same branch: the medians are summed over the ranks by NCCL first.
  const double mine[2] = {median(probe_dense_ms_), median(probe_sparse_ms_)};
  float host[2] = {static_cast<float>(mine[0]), static_cast<float>(mine[1])};
  FUSEKIT_CUDA_CHECK(cudaMemcpy(sum_, host, sizeof host, cudaMemcpyHostToDevice));
  FUSEKIT_NCCL_CHECK(ncclAllReduce(sum_, sum_, 2, ncclFloat, ncclSum, communicator_.comm(), communicator_.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(communicator_.stream()));
  FUSEKIT_CUDA_CHECK(cudaMemcpy(host, sum_, sizeof host, cudaMemcpyDeviceToHost));
  const double dense_ms = host[0] / communicator_.size(), sparse_ms = host[1] / communicator_.size();
  chosen_ = sparse_ms < dense_ms ? 1 : 0;
  char line[256];
  std::snprintf(line, sizeof line,
                "auto: %s (median over %d probe steps, mean over %d ranks: dense allreduce %.3f ms, sparse at "
                "density %g with the %s collective %.3f ms)",
                chosen_ ? "sparse" : "dense", options_.probe_steps, communicator_.size(), dense_ms, options_.density,
                collective_kind_name(options_.collective), sparse_ms);
  decision_ = line;
  // The probes' residual holds what they did not send of gradients the dense exchange sent whole.
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(feedback_->residual(), 0, feedback_->elements() * sizeof(float), stream));
  if (feedback_->momentum()) {
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(feedback_->momentum(), 0, feedback_->elements() * sizeof(float), stream));
  }
  FUSEKIT_CUDA_CHECK(cudaFree(probe_copy_));
  probe_copy_ = nullptr;
}

ExchangeRecord GradientExchanger::last() {
  ExchangeRecord r = record_;
  if (ran_sparse_) {
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(events_[kNarrowed]));
    r.selection_ms = elapsed_ms(events_[kStart], events_[kSelected]);
    r.communication_ms = elapsed_ms(events_[kSelected], events_[kCommunicated]);
    r.narrow_ms = elapsed_ms(events_[kCommunicated], events_[kNarrowed]);
    unsigned long long bad = 0;
    FUSEKIT_CUDA_CHECK(cudaMemcpy(&bad, nonfinite_, sizeof bad, cudaMemcpyDeviceToHost));
    r.nonfinite = bad;
  } else if (ran_dense_) {
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(events_[kDenseEnd]));
    r.communication_ms = elapsed_ms(events_[kDenseStart], events_[kDenseEnd]);
  }
  return r;
}

}  // namespace fusekit::dp
