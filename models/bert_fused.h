// The fused BERT masked-LM training step (models/bert_model.h's function) on fusekit's kernels, in
// the manner of LightSeq2: every layer's forward and backward written out over kernels/, every
// activation and gradient at a planned place in one arena (models/memory_plan.h) allocated at
// construction, parameters and gradients in the flat buffers of kernels/adamw.h's AdamWTrainer
// (models/bert_parameters.h's packed layout, decaying parameters first). A step allocates nothing.
//
// Per encoder layer, forward (N tokens, H hidden, I intermediate):
//   qkv = x Wqkv^T + bqkv                      cuBLASLt, bias epilogue; [N, 3, heads, head_dim]
//   context = attention(qkv, lengths)          kernels/bert_attention.h (mask, softmax, dropout, P V)
//   dense = context Wo^T                       cuBLASLt, no epilogue (the bias goes to the next kernel)
//   a = LN(x + dropout(dense + bo))            kernels/bias_dropout_residual_layernorm.h, post-LN
//   g = gelu(a W1^T + b1)                      cuBLASLt, GELU_AUX_BIAS (pre-activation kept)
//   down = g W2^T                              cuBLASLt, no epilogue
//   out = LN(a + dropout(down + b2))           as above
// The head gathers the masked rows first (kernels/gather_rows.h), so its dense layer, GELU,
// LayerNorm, decoder and cross-entropy run on M = batch x max_masked_per_sequence rows instead of N.
// The backward walks the same path in reverse; where two gradients meet (the residual stream and a
// branch) the second GEMM accumulates into the first's output (beta = 1), so no add kernel runs.
// The tied decoder's weight gradient is added into the word embedding's after the embedding
// backward has written it.
//
// Dropout: every site (the embeddings, each layer's attention probabilities, attention output and
// FFN output) draws from its own Philox key, derived from the seed and the site, at the counter
// offset of the step (a device word each forward advances first, kernels/step_counter.h); the
// backward regenerates the same masks from the same key and offset.
//
// CUDA graph (capture_step_graphs): one graph per prepared batch, replayed by enqueue_step; what
// changes from step to step lives on the device (the dropout step, AdamW's step count), while the
// learning rate and the loss scale are fixed at capture (a new rate is refused, and so is a
// gradient exchange).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/bert_attention.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/linear.h"
#include "models/bert_model.h"
#include "models/bert_parameters.h"
#include "models/gradient_exchange.h"
#include "models/memory_plan.h"
#include "models/step_graph.h"

namespace fusekit::models {

class FusedBert final : public BertMlmModel {
 public:
  // Validates the config (validate()), allocates everything a step needs and zeroes the parameters
  // (load_state_dict fills them). master_weights: the trainer keeps fp32 master weights.
  FusedBert(const BertConfig& config, const BertTrainOptions& options, bool master_weights = true);
  ~FusedBert() override;
  FusedBert(const FusedBert&) = delete;
  FusedBert& operator=(const FusedBert&) = delete;

  const char* variant() const override { return "fused"; }
  const BertConfig& config() const override { return config_; }
  void load_state_dict(const std::vector<TensorView>& tensors) override;
  float forward_backward(const MlmBatch& batch) override;
  float step(const MlmBatch& batch) override;
  void prepare_batches(const std::vector<MlmBatch>& batches) override;
  void enqueue_step(int batch_index, cudaStream_t stream) override;
  // Captures each prepared batch's step (forward, backward, AdamW) as a CUDA graph
  // (models/step_graph.h), which enqueue_step replays from then on; prepare_batches drops them.
  // Runs each batch's forward and backward once first (no update; the dropout step is restored).
  // Throws std::logic_error with a gradient exchange set or before prepare_batches.
  void capture_step_graphs();
  bool graphed() const { return !graphs_.empty(); }
  float last_loss() override;
  std::vector<HostTensor> gradients() override;
  std::vector<HostTensor> parameters() override;

  // Data-parallel training: `exchange` (not owned; nullptr: none) runs inside every step between
  // the backward and AdamW, in an NVTX range "bert.exchange", on the flat gradients below.
  // std::logic_error once steps are captured (capture_step_graphs).
  void set_gradient_exchange(GradientExchange* exchange);
  FlatGradients flat_gradients() const;
  // The learning rate of the steps enqueued from now on (a schedule's).
  // std::logic_error for another rate once steps are captured (their AdamW step holds it).
  void set_learning_rate(double lr);
  // Forward passes so far: the dropout masks' counter offset (reads the device; synchronizes).
  uint64_t dropout_step() const;
  // For tests that take a step apart: the dropout step the next forward draws after (its masks are
  // those of step + 1), and which kinds of dropout site keep their p (bit k: kind k of
  // dropout_site_kind; the others drop nothing). Neither is for training.
  void set_dropout_step(uint64_t step);
  void set_dropout_site_kinds(uint32_t kinds);  // std::logic_error once steps are captured
  // 0 the embeddings, 1 attention probabilities, 2 attention output, 3 FFN output.
  static int dropout_site_kind(int site) { return site == 0 ? 0 : (site - 1) % 3 + 1; }

  // The Philox key of dropout site `site` (0 the embeddings; 1 + 3l, 2 + 3l, 3 + 3l layer l's
  // attention probabilities, attention output and FFN output) for seed `seed`; a step's masks draw
  // at counter offset (forward passes so far, this one included): kernels/detail/philox.cuh's
  // dropout_kept(key, offset, element, threshold) regenerates them on the host.
  static uint64_t dropout_key(uint64_t seed, int site);

  const MemoryPlan& memory_plan() const { return *plan_; }
  const BertParameterLayout& layout() const { return layout_; }

 private:
  struct DeviceBatch {
    const int64_t* input_ids;
    const int64_t* token_type_ids;
    const int32_t* lengths;
    const int32_t* masked_positions;  // [M], distinct (models/mlm_data.h's gathered_rows)
    const int64_t* masked_labels;     // [M]
  };
  void upload(const MlmBatch& batch, const DeviceBatch& into, cudaStream_t stream);
  DeviceBatch arena_batch() const;
  void forward(const DeviceBatch& batch, cudaStream_t stream);
  void backward(const DeviceBatch& batch, cudaStream_t stream);
  void exchange_gradients(cudaStream_t stream);
  void optimizer_step(cudaStream_t stream);
  void* buffer(const char* name) const;
  void* buffer(const std::string& name) const { return buffer(name.c_str()); }
  void* parameter(const std::string& name) const;
  void* gradient(const std::string& name) const;
  std::vector<HostTensor> host_tensors(const void* flat, float scale) const;
  kernels::Dropout dropout(float p, int site) const;
  kernels::BertAttentionDropout attention_dropout(float p, int site) const;

  BertConfig config_;
  BertTrainOptions options_;
  bool master_weights_;
  float loss_scale_;
  BertParameterLayout layout_;
  std::unique_ptr<MemoryPlan> plan_;
  std::unique_ptr<kernels::LinearContext> linear_;
  std::unique_ptr<kernels::AdamWTrainer> trainer_;
  char* arena_ = nullptr;
  void* zeros_ = nullptr;       // [max(H, I)] of the storage type: the bias of GELU's backward on a pre-activation
  std::vector<void*> batches_;  // prepare_batches' device copies, one allocation each
  std::vector<DeviceBatch> device_batches_;
  cudaStream_t stream_ = nullptr;  // step() and forward_backward()
  cudaStream_t last_stream_ = nullptr;
  uint64_t* step_counter_ = nullptr;   // device: forward passes so far, the dropout masks' offset
  uint32_t dropout_site_kinds_ = ~0u;  // set_dropout_site_kinds'
  std::vector<std::unique_ptr<StepGraph>> graphs_;
  GradientExchange* exchange_ = nullptr;
  float gradient_divisor_ = 1.f;  // the last exchange's
};

}  // namespace fusekit::models
