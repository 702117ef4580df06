// Swin image classification as a PyTorch user trains timm's SwinTransformer today, in libtorch: the
// model written with torch::nn modules in timm 1.x's structure (so its parameters carry timm's
// names, models/swin_parameters.h), autocast, autograd, a static loss scale and
// torch.optim.AdamW(fused=True) with timm's parameter groups (weight decay on the Linear and Conv2d
// weights only); the "baseline" variant of the models suite's swin_step, beside models/swin_fused.h.
//
// What it computes is timm's default path, line by line:
//   patch_embed   Conv2d(in, C, patch, stride patch), NCHW -> NHWC, LayerNorm
//   stage s       s >= 1: PatchMerging (the 2 x 2 neighbours as timm 1.x orders them, LayerNorm over
//                 4D, Linear 4D -> 2D without bias); then the blocks
//   block         x + window_reverse(attn(window_partition(roll(norm1(x), -shift))), rolled back),
//                 then x + fc2(gelu(fc1(norm2(x)))) (exact GELU, nn.GELU's default)
//   attention     timm's WindowAttention without fused attention (its default: timm enables the
//                 fused path for Swin only with TIMM_FUSED_ATTN=2): q scaled, q k^T, + the relative
//                 position bias (table[index]), + the shift mask (0 / -100 per window, odd blocks
//                 of stages wider than one window), softmax, @ v, heads merged, proj
//   head          final LayerNorm, the mean over the grid, Linear to the classes, then
//                 cross-entropy with label smoothing (SwinTrainOptions, 0.1), labels -100 ignored.
// No dropout and no stochastic depth, as the fused step (timm's defaults for these models are 0
// except drop_path_rate, which both variants leave at 0).
//
// Precision and the step: as baselines/models/bert_baseline.h (BaselinePrecision::amp runs the
// forward under torch.autocast to the config's dtype with fp32 parameters; ::fp32 runs everything
// in fp32, TF32 off for the patch embedding's convolution too, the equivalence tests' reference), with
// baselines/models/amp_training.h's loop: gradients to None, the forward under autocast, (loss * scale).backward(),
// unscale_ and the fused AdamW that skips the step on a non-finite gradient. The weights start as torch's module
// defaults; the suites and tests load a timm state dict (models/swin_init.h, models/swin_checkpoint.h). NVTX ranges as
// the fused step's: swin.step > swin.forward / swin.backward / swin.optimizer > swin.patch_embed,
// swin.stage.S.downsample, swin.stage.S.block.B, swin.head.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <vector>

#include "baselines/models/amp_training.h"
#include "models/safetensors.h"  // TensorView
#include "models/swin_config.h"
#include "models/swin_fused.h"  // SwinBatch, SwinTrainOptions, HostTensor
#include "models/swin_parameters.h"

namespace fusekit::baselines {

namespace detail {
class SwinTransformerImpl;  // the torch::nn module tree (swin_baseline.cpp)
}

class BaselineSwin {
 public:
  // On the current CUDA device. Throws std::invalid_argument for a config that validate() rejects.
  BaselineSwin(const models::SwinConfig& config, const models::SwinTrainOptions& options = {},
               BaselinePrecision precision = BaselinePrecision::amp);
  ~BaselineSwin();
  BaselineSwin(const BaselineSwin&) = delete;
  BaselineSwin& operator=(const BaselineSwin&) = delete;

  const char* variant() const;  // "baseline", or "baseline-fp32"
  const models::SwinConfig& config() const { return config_; }

  // A timm state dict (models/swin_checkpoint.h's names and aliases); resets the optimizer's state.
  void load_state_dict(const std::vector<models::TensorView>& tensors);
  // Forward and backward of one batch, no update: the mean loss (synchronizes).
  float forward_backward(const models::SwinBatch& batch);
  // One training step (forward, backward, AdamW): the loss (synchronizes).
  float step(const models::SwinBatch& batch);
  // For timing: batches copied to the device once, then steps enqueued without a host sync.
  void prepare_batches(const std::vector<models::SwinBatch>& batches);
  void enqueue_step(int batch_index, cudaStream_t stream);
  float last_loss();
  // The last forward_backward's or step's gradients (unscaled) and the parameters, in timm's names
  // and shapes, in the parameter layout's order.
  std::vector<models::HostTensor> gradients();
  std::vector<models::HostTensor> parameters();

 private:
  struct DeviceBatch {
    at::Tensor images;  // float32 [batch, in_channels, image, image]
    at::Tensor labels;  // int64 [batch]
  };

  DeviceBatch to_device(const models::SwinBatch& batch) const;
  at::Tensor forward_backward_scaled(const DeviceBatch& batch);  // the loss, detached
  at::Tensor train_step(const DeviceBatch& batch);

  models::SwinConfig config_;
  models::SwinTrainOptions options_;
  BaselinePrecision precision_;
  models::SwinParameterLayout layout_;  // fp32 storage: the order of parameters_
  at::Device device_;
  std::shared_ptr<detail::SwinTransformerImpl> model_;
  std::vector<at::Tensor> parameters_;
  std::unique_ptr<AmpAdamW> trainer_;
  std::vector<DeviceBatch> batches_;
  StepRunner runner_;  // last: destroyed first, it waits for the last step
};

}  // namespace fusekit::baselines
