// The mixed-precision training loop PyTorch users write, in libtorch, shared by the whole-model
// baselines (bert_baseline.h, swin_baseline.h):
//
//   AutocastRegion   torch.autocast("cuda", dtype=...)'s __enter__ and __exit__, as a scope;
//   StepRunner       the stream of the last step and its loss, and host copies read after it;
//   AmpAdamW         optimizer.zero_grad(set_to_none=True), scaler.scale(loss), scaler.unscale_(opt)
//                    and scaler.step(opt) of a torch.amp.GradScaler with a static scale over
//                    torch.optim.AdamW(fused=True) with two parameter groups: weight decay on the
//                    parameters marked as decaying, none on the others.
//
// unscale(): at::_amp_foreach_non_finite_check_and_unscale_ over every gradient into one found_inf
// flag. step(): per group, GradScaler.step's call of the fused optimizer after unscale_ (found_inf,
// no grad_scale; baselines/adamw.h), which leaves everything unchanged where found_inf is set. The
// scale is static (the models' effective_loss_scale), so GradScaler.update is not run. The
// optimizer's state is created as torch.optim does at its first step: moments zeros like the
// parameter, a 0-dim float32 step count per parameter on its device.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "baselines/adamw.h"
#include "kernels/dtype.h"
#include "models/bert_model.h"       // HostTensor
#include "models/bert_parameters.h"  // BertParameter (SwinParameter): name and shape
#include "profiler/range.h"

namespace fusekit::baselines {

enum class BaselinePrecision {
  amp,   // fp32 parameters, forward under autocast to the config's dtype
  fp32,  // fp32 throughout, no autocast
};

// The autocast dtype of a model's 16-bit config dtype: bfloat16 for bf16, float16 otherwise.
inline at::ScalarType autocast_dtype(kernels::DType dtype) {
  return dtype == kernels::DType::bf16 ? at::kBFloat16 : at::kHalf;
}

// Where `enabled`, float32 is float32 for the scope: PyTorch lets cuDNN's convolutions use TF32 by
// default (torch.backends.cudnn.allow_tf32), which rounds their inputs to 10 mantissa bits; a
// float32 reference step turns that (and TF32 matmuls) off, as the Python references do, and the
// previous settings come back at the end of the scope.
class Float32Region {
 public:
  explicit Float32Region(bool enabled);
  ~Float32Region();
  Float32Region(const Float32Region&) = delete;
  Float32Region& operator=(const Float32Region&) = delete;

 private:
  bool enabled_;
  bool previous_cudnn_ = true, previous_cublas_ = false;
};

// torch.autocast("cuda", dtype) for the scope's lifetime; nothing where `enabled` is false.
class AutocastRegion {
 public:
  AutocastRegion(bool enabled, at::ScalarType dtype);
  ~AutocastRegion();
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  bool enabled_;
  bool previous_enabled_ = false;
  bool previous_cache_enabled_ = true;
  at::ScalarType previous_dtype_ = at::kHalf;
};

// Where a baseline model's steps run and what the last one left, so that readers (the loss, the
// parameters, the destructor) order themselves after it: the stream of the last step and its loss.
//   run_now(f)         forward_backward and step: f() on the current stream, its loss read (a sync)
//   enqueue(stream, f) enqueue_step: f() on the caller's stream (a PyTorch stream wrapping it)
class StepRunner {
 public:
  StepRunner(const at::Device& device, std::string who) : device_(device), who_(std::move(who)) {}
  ~StepRunner();  // waits for the last step: no step may read memory the caching allocator gets back
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  template <class F>
  float run_now(F&& f, bool keep_loss) {
    last_stream_ = c10::cuda::getCurrentCUDAStream(device_.index());
    const at::Tensor loss = f();
    if (keep_loss) last_loss_ = loss;
    return loss.item<float>();
  }
  template <class F>
  void enqueue(cudaStream_t stream, F&& f) {
    const c10::cuda::CUDAStream torch_stream = c10::cuda::getStreamFromExternal(stream, device_.index());
    const c10::cuda::CUDAStreamGuard guard(torch_stream);
    last_loss_ = f();
    last_stream_ = torch_stream;
  }
  void synchronize() const;  // with the last step, where one ran
  float last_loss() const;   // std::logic_error before the first step
  // Host copies of `tensors` (their gradients where `gradients`), named and shaped as `layout` says,
  // read after the last step.
  std::vector<models::HostTensor> host_copies(const std::vector<at::Tensor>& tensors,
                                              const std::vector<models::BertParameter>& layout, bool gradients) const;

 private:
  at::Device device_;
  std::string who_;
  at::Tensor last_loss_;
  std::optional<c10::cuda::CUDAStream> last_stream_;
};

class AmpAdamW {
 public:
  // `parameters` (the module's, in any fixed order) and `decays` of the same length; `hyper` is
  // the decaying group's, the other group takes it with weight_decay 0.
  AmpAdamW(std::vector<at::Tensor> parameters, const std::vector<bool>& decays, const AdamWHyperparameters& hyper,
           double loss_scale);

  // The step PyTorch users write, with NVTX ranges <prefix>.step > <prefix>.forward /
  // <prefix>.backward / <prefix>.optimizer: optimizer.zero_grad(set_to_none=True); under autocast
  // to `dtype` where `autocast`, loss = forward(); scaler.scale(loss).backward() (forward_backward
  // stops here and returns the loss, detached); scaler.unscale_(optimizer); scaler.step(optimizer).
  // Without autocast the forward and backward run in a Float32Region.
  template <class Forward>
  at::Tensor forward_backward(const std::string& prefix, bool autocast, at::ScalarType dtype, Forward&& forward) {
    zero_grad();
    const Float32Region float32(!autocast);  // without autocast, float32 throughout: no TF32, backward too
    at::Tensor loss;
    {
      profiler::ScopedRange range(prefix + ".forward");
      const AutocastRegion region(autocast, dtype);
      loss = forward();
    }
    profiler::ScopedRange range(prefix + ".backward");
    scaled(loss).backward();
    return loss.detach();
  }
  template <class Forward>
  at::Tensor train_step(const std::string& prefix, bool autocast, at::ScalarType dtype, Forward&& forward) {
    profiler::ScopedRange range(prefix + ".step");
    const at::Tensor loss = forward_backward(prefix, autocast, dtype, std::forward<Forward>(forward));
    profiler::ScopedRange optimizer(prefix + ".optimizer");
    unscale();
    step();
    return loss;
  }

  void zero_grad();  // every gradient to None
  // The loss times the scale (scaler.scale(loss)), for backward().
  at::Tensor scaled(const at::Tensor& loss) const { return loss * scale_; }
  void unscale();      // scaler.unscale_(optimizer): found_inf set on an inf or NaN gradient
  void step();         // scaler.step(optimizer) after unscale()
  void reset_state();  // moments and step counts back to zero (a new checkpoint)
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const at::Tensor& found_inf() const { return found_inf_; }

 private:
  struct Group {
    std::vector<size_t> members;  // indices into parameters_
    AdamWHyperparameters hyper{};
    AdamWTensors state;  // the gradients are gathered into it for each step only
  };
  std::vector<at::Tensor> parameters_;
  std::array<Group, 2> groups_;               // decaying, not decaying
  at::Tensor scale_, inv_scale_, found_inf_;  // 0-dim float32 on the parameters' device
};

}  // namespace fusekit::baselines
