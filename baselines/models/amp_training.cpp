#include "baselines/models/amp_training.h"

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAGuard.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace fusekit::baselines {

Float32Region::Float32Region(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  previous_cudnn_ = at::globalContext().allowTF32CuDNN();
  previous_cublas_ = at::globalContext().allowTF32CuBLAS();
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
}

Float32Region::~Float32Region() {
  if (!enabled_) return;
  at::globalContext().setAllowTF32CuDNN(previous_cudnn_);
  at::globalContext().setAllowTF32CuBLAS(previous_cublas_);
}

AutocastRegion::AutocastRegion(bool enabled, at::ScalarType dtype) : enabled_(enabled) {
  if (!enabled_) return;
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  previous_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
  previous_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(true);
}

AutocastRegion::~AutocastRegion() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(at::kCUDA, previous_enabled_);
  at::autocast::set_autocast_dtype(at::kCUDA, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

StepRunner::~StepRunner() {
  if (last_stream_) (void)cudaStreamSynchronize(last_stream_->stream());
}

void StepRunner::synchronize() const {
  if (last_stream_) last_stream_->synchronize();
}

float StepRunner::last_loss() const {
  if (!last_loss_.defined()) throw std::logic_error(who_ + ": no step has run");
  c10::cuda::OptionalCUDAStreamGuard guard;
  if (last_stream_) guard.reset_stream(*last_stream_);
  return last_loss_.item<float>();
}

std::vector<models::HostTensor> StepRunner::host_copies(const std::vector<at::Tensor>& tensors,
                                                        const std::vector<models::BertParameter>& layout,
                                                        bool gradients) const {
  c10::cuda::OptionalCUDAStreamGuard guard;
  if (last_stream_) guard.reset_stream(*last_stream_);
  std::vector<models::HostTensor> out;
  for (size_t i = 0; i < tensors.size() && i < layout.size(); ++i) {
    const at::Tensor source = gradients ? tensors[i].grad() : tensors[i].detach();
    if (!source.defined()) throw std::logic_error(who_ + ": no gradients yet (run forward_backward or step)");
    const at::Tensor host = source.to(at::kCPU).contiguous();
    models::HostTensor tensor{layout[i].name, layout[i].shape, {}};
    tensor.values.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
    out.push_back(std::move(tensor));
  }
  return out;
}

AmpAdamW::AmpAdamW(std::vector<at::Tensor> parameters, const std::vector<bool>& decays,
                   const AdamWHyperparameters& hyper, double loss_scale)
    : parameters_(std::move(parameters)) {
  if (parameters_.empty() || decays.size() != parameters_.size()) {
    throw std::invalid_argument("amp adamw: " + std::to_string(parameters_.size()) + " parameters and " +
                                std::to_string(decays.size()) + " decay flags");
  }
  groups_[0].hyper = hyper;
  groups_[1].hyper = hyper;
  groups_[1].hyper.weight_decay = 0.0;
  const auto floats = at::TensorOptions().dtype(at::kFloat).device(parameters_[0].device());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Group& group = groups_[decays[i] ? 0 : 1];
    group.members.push_back(i);
    group.state.params.push_back(parameters_[i]);
    group.state.exp_avgs.push_back(at::zeros_like(parameters_[i]));
    group.state.exp_avg_sqs.push_back(at::zeros_like(parameters_[i]));
    group.state.steps.push_back(at::zeros({}, floats));
  }
  scale_ = at::full({}, loss_scale, floats);
  inv_scale_ = at::full({}, static_cast<float>(1.0 / loss_scale), floats);  // scale.double().reciprocal().float()
  found_inf_ = at::zeros({}, floats);
}

void AmpAdamW::zero_grad() {
  for (at::Tensor& p : parameters_) p.mutable_grad().reset();
}

void AmpAdamW::unscale() {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : parameters_) {
    if (!p.grad().defined()) throw std::logic_error("amp adamw: a parameter has no gradient (run backward first)");
    grads.push_back(p.grad());
  }
  found_inf_.zero_();
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale_);
}

void AmpAdamW::step() {
  for (Group& group : groups_) {
    if (group.members.empty()) continue;
    for (size_t i : group.members) group.state.grads.push_back(parameters_[i].grad());
    adamw_fused_step(group.state, group.hyper, found_inf_);
    group.state.grads.clear();  // the next zero_grad sets the gradients to None: hold no reference to them
  }
}

void AmpAdamW::reset_state() {
  for (Group& group : groups_) {
    if (group.members.empty()) continue;
    at::_foreach_zero_(group.state.exp_avgs);
    at::_foreach_zero_(group.state.exp_avg_sqs);
    at::_foreach_zero_(group.state.steps);
  }
}

}  // namespace fusekit::baselines
