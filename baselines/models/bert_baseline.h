// BERT masked-LM pre-training as a PyTorch user runs it today, in libtorch: the model written with
// torch::nn modules in Hugging Face's BertForMaskedLM structure (so its parameters carry Hugging
// Face's names), autocast, autograd, a static loss scale and torch.optim.AdamW(fused=True). The
// function, the step and the NVTX ranges are models/bert_model.h's; this is its "baseline" variant.
//
// Precision: BaselinePrecision::amp keeps fp32 parameters and runs the forward under
// torch.autocast("cuda", dtype=config.dtype) (fp16 or bf16), as torch.amp users train;
// BaselinePrecision::fp32 runs everything in fp32 with no autocast, the reference of the equivalence
// tests. The config is validated as models/bert_config.h says (its dtype is 16-bit); the precision is
// a separate argument for that reason.
//
// Attention goes through at::scaled_dot_product_attention, as Hugging Face's BertSdpaSelfAttention
// does: "sdpa" is what transformers 4.5x picks by default for BertForMaskedLM where SDPA is available
// (every torch >= 2.1.1), and so what a user gets. Its mask is the one BertModel builds for SDPA
// (_prepare_4d_attention_mask_for_sdpa): [batch, 1, seq, seq] additive, 0 for valid keys and the
// lowest float for padded ones, in the embeddings' dtype (fp32: LayerNorm runs in fp32 under
// autocast), which autocast casts to the 16-bit type (where it becomes -inf). One difference:
// Hugging Face drops the mask after checking on the host that no sequence is padded (a device sync);
// this baseline always passes it, which gives the same numbers and keeps enqueue_step free of syncs.
//
// The step: gradients set to None, the forward (loss included, as BertForMaskedLM computes it: cross-
// entropy over the logits of every position, labels -100 ignored) under autocast, (loss * scale)
// .backward() outside it, GradScaler.unscale_ (at::_amp_foreach_non_finite_check_and_unscale_ into
// one found_inf flag), then GradScaler.step's call of the fused AdamW: per parameter group (weight
// decay on the parameters whose BertParameter::decays is true, none on the others), steps += 1,
// at::_fused_adamw_ with found_inf (which skips the update where it is set), steps -= found_inf, the
// step counts being 0-dim float tensors per parameter as torch.optim keeps them for fused=True. The
// scale is static (BertTrainOptions::effective_loss_scale), so GradScaler.update is not run.
//
// Randomness: dropout (torch::nn::Dropout and SDPA's dropout_p) draws from torch's default CUDA
// generator, which the constructor seeds with options.seed (torch::cuda::manual_seed): it is
// process-wide, as torch.manual_seed is, so models stepped in turn share its stream. The initial
// weights, Hugging Face's _init_weights (normal(0, 0.02), padding row 0, LayerNorm 1 and 0, biases 0),
// draw from a CPU generator of the same seed.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "baselines/models/amp_training.h"
#include "models/bert_model.h"
#include "models/bert_parameters.h"

namespace fusekit::baselines {

namespace detail {
class BertForMaskedLMImpl;  // the torch::nn module tree (bert_baseline.cpp)
struct DropoutOverride;
}  // namespace detail

class BaselineBert : public models::BertMlmModel {
 public:
  // On the current CUDA device. Throws std::invalid_argument for a config that validate() rejects.
  BaselineBert(const models::BertConfig& config, const models::BertTrainOptions& options,
               BaselinePrecision precision = BaselinePrecision::amp);
  ~BaselineBert() override;

  const char* variant() const override;  // "baseline", or "baseline-fp32"
  const models::BertConfig& config() const override { return config_; }
  BaselinePrecision precision() const { return precision_; }

  void load_state_dict(const std::vector<models::TensorView>& tensors) override;
  float forward_backward(const models::MlmBatch& batch) override;
  float step(const models::MlmBatch& batch) override;
  void prepare_batches(const std::vector<models::MlmBatch>& batches) override;
  void enqueue_step(int batch_index, cudaStream_t stream) override;
  float last_loss() override;
  std::vector<models::HostTensor> gradients() override;
  std::vector<models::HostTensor> parameters() override;

  // For tests: the dropout masks of every later training forward come from `masks` (site, sizes)
  // -> a {0, 1} tensor of those sizes on the device, site as models/bert_fused.h numbers them (0
  // the embeddings; 1 + 3l, 2 + 3l, 3 + 3l layer l's attention probabilities, attention output and
  // FFN output), kept elements scaled by 1 / (1 - p); the attention then runs SDPA's math in
  // separate operators. An empty function returns to torch's generator.
  using DropoutMasks = std::function<at::Tensor(int site, at::IntArrayRef sizes)>;
  void set_dropout_masks(DropoutMasks masks);

 private:
  // A batch on the device, as a data loader hands it to BertForMaskedLM (int64 [batch, seq] each;
  // attention_mask 1 for real tokens, 0 for padding, from the lengths).
  struct DeviceBatch {
    at::Tensor input_ids, token_type_ids, labels, attention_mask;
  };
  DeviceBatch to_device(const models::MlmBatch& batch) const;
  // Gradients to None, the forward under autocast and (loss * scale).backward(): the loss, detached.
  at::Tensor forward_backward_scaled(const DeviceBatch& batch);
  at::Tensor train_step(const DeviceBatch& batch);

  models::BertConfig config_;
  BaselinePrecision precision_;
  models::BertParameterLayout layout_;  // separate query, key and value; the order of parameters_
  at::Device device_;
  std::shared_ptr<detail::DropoutOverride> masks_;  // shared with the modules; before model_
  std::shared_ptr<detail::BertForMaskedLMImpl> model_;
  std::vector<at::Tensor> parameters_;  // the module's parameters in layout_'s order
  std::unique_ptr<AmpAdamW> trainer_;   // GradScaler (static scale) + AdamW(fused=True), two groups
  at::Tensor position_ids_;             // [1, sequence]: 0 .. sequence-1
  std::vector<DeviceBatch> batches_;
  StepRunner runner_;  // last: destroyed first, it waits for the last step
};

}  // namespace fusekit::baselines
