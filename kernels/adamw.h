// AdamW, as torch.optim.AdamW computes it (decoupled weight decay, one parameter group), over many
// tensors in one launch; and a mixed-precision trainer over flat parameter and gradient buffers.
//
//   step t >= 1 (the steps taken, this one included), g the gradient:
//   p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g,  v = beta2 * v + (1 - beta2) * g^2
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Arithmetic is in float registers; m (exp_avg) and v (exp_avg_sq) are stored as float.
//
// adamw_step: float tensors of any sizes and alignments, each with its own param, grad, exp_avg and
// exp_avg_sq. An AdamWTensorList cuts the tensors into chunks once, on the host, and uploads the
// chunk table; every step then is one launch whose blocks walk the table.
//
// AdamWTrainer (the LightSeq2 trainer): fp16 or bf16 parameters and gradients of all tensors live
// in two flat buffers, each tensor a view starting on a 16-byte boundary (the padding is zeros and
// stays zeros), so the update is one 16-byte-vector loop over the flat buffers with no tables.
// Gradients arrive multiplied by the loss scale; a non-finite gradient anywhere skips the step
// (parameters, moments and the step count unchanged), decided on the device without a host sync.
// With master weights the update runs on an fp32 copy and writes the parameters rounded to their
// type; without, it runs in fp32 registers from the 16-bit parameters.
//
// Per-parameter weight decay (BERT's recipe decays weights, not biases and LayerNorm parameters):
// the first `decayed_tensors` tensors of `sizes` take weight_decay, the rest are updated as with
// weight_decay = 0 (p * 1, exactly). The caller orders its tensors so that those that decay come
// first (models/bert_parameters.h does). The update compares each element's flat index with the
// offset where tensor `decayed_tensors` starts: offsets are multiples of 8 elements and a thread
// owns 4 consecutive ones from a multiple of 4, so a thread's elements lie on one side of it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::kernels {

// torch.optim.AdamW's hyperparameters (its defaults).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// Element offsets of tensors of `sizes` laid end to end, each starting on a multiple of
// `alignment_elements`; `elements` is the padded total.
struct FlatLayout {
  std::vector<size_t> offsets;
  size_t elements = 0;
};
FlatLayout flat_layout(const std::vector<size_t>& sizes, size_t alignment_elements);

// ---- AdamW over a list of float tensors

struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  size_t count;
};

// The device-side chunk table of one tensor list: build it once per list and reuse it every step.
class AdamWTensorList {
 public:
  explicit AdamWTensorList(const std::vector<AdamWTensor>& tensors);
  ~AdamWTensorList();
  AdamWTensorList(const AdamWTensorList&) = delete;
  AdamWTensorList& operator=(const AdamWTensorList&) = delete;

  int chunks() const { return chunk_count_; }
  size_t elements() const { return elements_; }

 private:
  friend void adamw_step(const AdamWTensorList& list, const AdamWOptions& options, int64_t step, cudaStream_t stream);
  void* table_ = nullptr;  // device: the tensor descriptors, then the chunk descriptors
  int tensor_count_ = 0;
  int chunk_count_ = 0;
  size_t elements_ = 0;
};

// One AdamW step over every tensor of the list, in one launch; `step` is t above (1 for the first).
void adamw_step(const AdamWTensorList& list, const AdamWOptions& options, int64_t step, cudaStream_t stream);

// ---- The mixed-precision trainer

class AdamWTrainer {
 public:
  static constexpr size_t kAllTensors = static_cast<size_t>(-1);

  // dtype: f16 or bf16; sizes: element counts of the tensors; decayed_tensors: how many of them,
  // from the first, take weight decay (kAllTensors: all). Allocates the flat buffers, zeroed.
  // Throws std::invalid_argument for fp32 or decayed_tensors > sizes.size() (other than kAllTensors).
  AdamWTrainer(DType dtype, const std::vector<size_t>& sizes, bool master_weights,
               size_t decayed_tensors = kAllTensors);
  ~AdamWTrainer();
  AdamWTrainer(const AdamWTrainer&) = delete;
  AdamWTrainer& operator=(const AdamWTrainer&) = delete;

  DType dtype() const { return dtype_; }
  bool master_weights() const { return master_ != nullptr; }
  size_t tensors() const { return sizes_.size(); }
  size_t size(size_t tensor) const { return sizes_.at(tensor); }
  size_t offset(size_t tensor) const { return layout_.offsets.at(tensor); }  // elements into the flat buffers
  size_t flat_elements() const { return layout_.elements; }
  size_t decayed_tensors() const { return decayed_tensors_; }  // sizes.size() where all decay
  // Elements of the flat buffers below which weight decay applies: offset(decayed_tensors()), or
  // flat_elements() where all tensors decay.
  size_t decay_end() const { return decay_end_; }

  // Flat buffers of flat_elements(): parameters and gradients of dtype(), the rest float.
  void* parameters() const { return parameters_; }
  void* gradients() const { return gradients_; }
  float* master() const { return master_; }  // nullptr without master weights
  float* exp_avg() const { return exp_avg_; }
  float* exp_avg_sq() const { return exp_avg_sq_; }
  // One tensor's view into the flat buffers.
  void* parameter(size_t tensor) const;
  void* gradient(size_t tensor) const;

  // Copies the parameters into the master weights (nothing without them): call it once the
  // parameters are written.
  void load_master_weights(cudaStream_t stream);

  // One step from gradients that hold loss_scale x the true gradients; skipped, on the device, if
  // any gradient is inf or NaN.
  void step(const AdamWOptions& options, float loss_scale, cudaStream_t stream);

  // AdamW with the second moment frozen (1-bit Adam's compression stage), for data-parallel
  // training that exchanges a momentum instead of gradients (dp/gradient_exchanger.h): the gradient
  // buffer holds loss_scale x an increment of a velocity u = velocity_factor u + g (the sum over
  // ranks of what they sent of it; loss_scale as in step() takes the rank count too), and
  //   m = (1 - velocity_factor) g,   m^ = m / (1 - velocity_factor^s),   v unchanged (not written),
  //   p = p * (1 - lr * weight_decay) - lr * m^ / (max(sqrt(v) / sqrt(1 - beta2^T), |m^| / K) + eps)
  // with s the steps since this freeze began (this one included) and T the AdamW steps taken (the
  // updates v had): the bias corrections of a velocity that starts from zero at the freeze and of v.
  // The |m^| / K in the denominator caps a step at K x lr (K = max_step >= 1): where v was zero or
  // small at the freeze (a coordinate the AdamW steps never saw), lr m^ / sqrt(v) would be huge. An
  // AdamW step moves a coordinate by about lr at most, so K = 1 bounds a step by one AdamW step;
  // an exchange that sends each coordinate once in about N steps (density 1/N) accumulates N steps'
  // velocity into one increment, and K = N lets it through. Below the cap, the parameters move as
  // AdamW with v frozen moves them for the same velocity (the exchange's error feedback makes the
  // increments add up to it). exp_avg holds the last step's m;
  // beta1 is unused (velocity_factor takes its place). A non-finite gradient skips the step as in
  // step(), and so does a frozen step before any AdamW step was taken (v is zero). A later step()
  // unfreezes; its bias corrections count AdamW steps only. Throws std::logic_error before any
  // step() call and std::invalid_argument for a velocity_factor outside [0, 1) or max_step below 1
  // (infinity: uncapped).
  void step_frozen_variance(const AdamWOptions& options, double velocity_factor, float loss_scale, cudaStream_t stream,
                            double max_step = 1.0);

  // The steps taken (skipped ones not counted). Synchronizes with `stream`.
  int64_t step_count(cudaStream_t stream) const;

 private:
  DType dtype_;
  std::vector<size_t> sizes_;
  FlatLayout layout_;
  size_t decayed_tensors_ = 0;
  size_t decay_end_ = 0;
  void* parameters_ = nullptr;
  void* gradients_ = nullptr;
  float* master_ = nullptr;
  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
  // Device state (adamw.cu): the step counts, the step's scalars and the check's verdict; then one
  // non-finite flag per block of the gradient check.
  void* state_ = nullptr;
  int* flags_ = nullptr;
  int check_blocks_ = 0;
  int64_t unfrozen_calls_ = 0;  // step() calls, skipped or not: with none, v is still zero

  void launch_step(const AdamWOptions& options, double velocity, double max_step, float loss_scale,
                   cudaStream_t stream);
};

}  // namespace fusekit::kernels
