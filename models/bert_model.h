// One interface for every variant of the BERT masked-LM training step, so that the tests, the
// suites and the CLI drive the libtorch baseline (baselines/models/) and the fused step (models/)
// the same way, from the same weights and batches.
//
// The function every variant computes (Hugging Face's BertForMaskedLM with hidden_act
// "gelu_pytorch_tanh", which is what the Python peers are configured with): embeddings (word +
// position + token type) + LayerNorm + dropout; post-LN encoder layers (self-attention with the
// key-padding mask of the batch's lengths, dropout on the probabilities, output projection, dropout,
// residual, LayerNorm; FFN with tanh-form GELU, dropout, residual, LayerNorm); the MLM head (dense,
// GELU, LayerNorm, decoder tied to the word embeddings, its own bias); cross-entropy over the
// masked positions (labels -100 elsewhere), mean over them. The GELU is the tanh form because that
// is what cuBLASLt's GELU epilogues compute (kernels/linear.h).
//
// The step: forward and backward on the loss times the loss scale, then AdamW (BertTrainOptions) on
// the gradients divided by the scale, skipped where any gradient is inf or NaN. Weight decay applies
// to the parameters whose BertParameter::decays is true (not to biases and LayerNorm parameters):
// the layout's first decayed_parameters(), AdamWTrainer's decayed_tensors.
//
// NVTX ranges (profiler/range.h), the same names in every variant so that reports put their shares
// side by side: "bert.step" around a step; inside it "bert.forward", "bert.backward" and
// "bert.optimizer"; inside the forward "bert.embeddings", "bert.layer.<i>" and "bert.head" (the
// fused step also inside its backward, whose kernels the baseline launches from autograd's thread).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "models/bert_config.h"
#include "models/mlm_data.h"
#include "models/safetensors.h"

namespace fusekit::models {

struct BertTrainOptions {
  // AdamW (torch.optim.AdamW's definition; BERT's eps).
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;  // on the parameters that decay (see above)
  // The static loss scale; 0 picks 1024 for fp16 and 1 for bf16 and fp32.
  float loss_scale = 0.f;
  // Dropout's random stream: two models with the same seed draw the same masks only within one
  // variant (the variants' generators differ).
  uint64_t seed = 0;
  float effective_loss_scale(kernels::DType dtype) const {
    return loss_scale > 0.f ? loss_scale : (dtype == kernels::DType::f16 ? 1024.f : 1.f);
  }
};

// A host copy of one named tensor, in float: parameters and gradients for tests and comparisons.
struct HostTensor {
  std::string name;  // Hugging Face's (separate query, key and value; no decoder weight)
  std::vector<int64_t> shape;
  std::vector<float> values;
};

class BertMlmModel {
 public:
  virtual ~BertMlmModel() = default;

  virtual const char* variant() const = 0;  // "fused", "baseline", ...
  virtual const BertConfig& config() const = 0;

  // Parameters from a Hugging Face BertForMaskedLM state dict, as models/bert_checkpoint.h reads
  // one (names, aliases, the tied decoder, conversions). Resets the optimizer's state.
  virtual void load_state_dict(const std::vector<TensorView>& tensors) = 0;

  // Batches are of the config's shape: batch x sequence (std::invalid_argument otherwise).
  // Forward and backward of one batch, no update: the mean masked-LM loss. gradients() then holds
  // this batch's gradients.
  virtual float forward_backward(const MlmBatch& batch) = 0;
  // One training step (forward, backward, AdamW): the loss, read back (synchronizes).
  virtual float step(const MlmBatch& batch) = 0;

  // For timing: batches copied to the device once, then steps enqueued without a host sync.
  virtual void prepare_batches(const std::vector<MlmBatch>& batches) = 0;
  virtual void enqueue_step(int batch_index, cudaStream_t stream) = 0;
  virtual float last_loss() = 0;  // the loss of the last step enqueued (synchronizes)

  // The gradients of the last forward_backward or step, the loss scale divided out, and the
  // parameters, in Hugging Face's names and shapes, as float.
  virtual std::vector<HostTensor> gradients() = 0;
  virtual std::vector<HostTensor> parameters() = 0;
};

}  // namespace fusekit::models
