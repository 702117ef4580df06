// The fused Swin image-classification training step on fusekit's kernels, as models/bert_fused.h is
// BERT's: every activation and gradient at a planned place in one arena (models/swin_memory_plan.h
// says which and what the forward computes), parameters and gradients in the flat buffers of the
// mixed-precision AdamW trainer (models/swin_parameters.h's layout, decaying parameters first), a
// step that allocates nothing. No dropout and no stochastic depth (timm's Swin-T and Swin-B defaults
// train with drop_path_rate 0.1-0.5; this step, like the libtorch baseline it is compared with, has
// none): the step is deterministic but for float atomics in no kernel it uses.
//
// The backward, per block, from the gradient g of its output x2 = x1 + fc2(gelu(fc1(LN2(x1)))):
//   fc2:  d gelu = g W2, dW2, db2;  bias + GELU: d up (into the spent gelu buffer), db1
//   fc1:  d LN2 = d up W1, dW1;  LN2 and the stream: dx1 = LN2 backward(d LN2) + g, one kernel
//         (kernels/bias_dropout_residual_layernorm.h's pre-LN backward with dropout 0)
//   merge: d proj = the window map of dx1;  proj: d out, dWproj, dbproj
//   window attention: d qkv, d table;  qkv: d windows, dWqkv, dbqkv
//   partition: LN1 backward through the window map, + dx1 (the shortcut): the block input's gradient.
// NVTX ranges: swin.step > swin.forward / swin.backward / swin.optimizer > swin.patch_embed,
// swin.stage.S.block.B, swin.stage.S.downsample, swin.head.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/linear.h"
#include "models/bert_model.h"  // HostTensor
#include "models/safetensors.h"
#include "models/step_graph.h"
#include "models/swin_memory_plan.h"
#include "models/swin_parameters.h"

namespace fusekit::models {

// One batch: images [batch, in_channels, image, image] (float, converted to the storage type on the
// device's side of the copy) and class labels [batch] (-100: ignored).
struct SwinBatch {
  std::vector<float> images;
  std::vector<int64_t> labels;
};

// timm's training recipe's defaults for Swin (AdamW, weight decay 0.05, label smoothing 0.1).
struct SwinTrainOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.05;
  float label_smoothing = 0.1f;
  float loss_scale = 0.f;  // 0: 1024 for fp16, 1 for bf16
  float effective_loss_scale(kernels::DType dtype) const {
    return loss_scale > 0.f ? loss_scale : (dtype == kernels::DType::f16 ? 1024.f : 1.f);
  }
};

class FusedSwin final {
 public:
  // Validates the config, allocates everything a step needs and zeroes the parameters.
  FusedSwin(const SwinConfig& config, const SwinTrainOptions& options = {}, bool master_weights = true);
  ~FusedSwin();
  FusedSwin(const FusedSwin&) = delete;
  FusedSwin& operator=(const FusedSwin&) = delete;

  const SwinConfig& config() const { return config_; }
  const SwinMemoryPlan& memory_plan() const { return *plan_; }
  // A timm state dict (models/swin_checkpoint.h); resets the optimizer's state and drops captured
  // steps.
  void load_state_dict(const std::vector<TensorView>& tensors);
  // Forward and backward of one batch, no update: the mean loss (synchronizes).
  float forward_backward(const SwinBatch& batch);
  // One training step (forward, backward, AdamW): the loss (synchronizes).
  float step(const SwinBatch& batch);
  // For timing: batches copied to the device once, then steps enqueued without a host sync.
  void prepare_batches(const std::vector<SwinBatch>& batches);
  void enqueue_step(int batch_index, cudaStream_t stream);
  // Captures each prepared batch's step as a CUDA graph (models/step_graph.h), which enqueue_step
  // replays from then on; prepare_batches drops them. Runs each batch's forward and backward once
  // first (no update). std::logic_error before prepare_batches.
  void capture_step_graphs();
  bool graphed() const { return !graphs_.empty(); }
  float last_loss();
  // The last forward_backward's or step's gradients (the loss scale divided out) and the
  // parameters, in timm's names and shapes, as float.
  std::vector<HostTensor> gradients();
  std::vector<HostTensor> parameters();

 private:
  void upload(const SwinBatch& batch, void* images, void* labels, cudaStream_t stream);
  void forward(const void* images, const int64_t* labels, cudaStream_t stream);
  void backward(const int64_t* labels, cudaStream_t stream);
  void optimizer_step(cudaStream_t stream);
  void enqueue_prepared(int batch_index, cudaStream_t stream, bool update);  // forward, backward[, AdamW]
  void* buffer(const std::string& name) const;
  void* parameter(const std::string& name) const;
  void* gradient(const std::string& name) const;
  std::vector<HostTensor> host_tensors(const void* flat, float scale) const;

  SwinConfig config_;
  SwinTrainOptions options_;
  bool master_weights_;
  float loss_scale_;
  SwinParameterLayout layout_;
  std::unique_ptr<SwinMemoryPlan> plan_;
  std::unique_ptr<kernels::LinearContext> linear_;
  std::unique_ptr<kernels::AdamWTrainer> trainer_;
  char* arena_ = nullptr;
  void* unused_bias_ = nullptr;  // [features]: a bias gradient nothing reads
  cudaStream_t stream_ = nullptr;
  cudaStream_t last_stream_ = nullptr;
  std::vector<void*> batches_;                      // per prepared batch: images, then labels
  std::vector<std::unique_ptr<StepGraph>> graphs_;  // capture_step_graphs': one per prepared batch
};

}  // namespace fusekit::models
