// Operator-suite cases for AdamW: one optimizer step (direction "fwd") over the parameter tensors
// of a named model, fused and (where libtorch is built in) the libtorch baseline.
//
//   fp32       fused: adamw_step over fp32 tensors (one launch over the chunk table)
//              baseline: torch.optim.AdamW(fused=True).step(), at::_fused_adamw_ over the same tensors
//   fp16/bf16  fused: the trainer with fp32 master weights, loss scale 1024
//              fused:no-master: the trainer without them (LightSeq2's layout: the 16-bit parameters
//              are updated in fp32 registers and rounded once), loss scale 1024
//              baseline: what AMP training runs on fp32 parameters of the same sizes,
//              GradScaler.step(AdamW(fused=True)) + update() (baselines/adamw.h). Its scale is 1:
//              PyTorch's fused kernel writes the unscaled gradients back, and any other scale would
//              shrink them towards zero over the repetitions; the work is the same for any scale.
//
// Bytes that must move per parameter (padding not counted), each variant's own layout:
//   fp32 tensor list:          read p, g, m, v; write p, m, v                 7 x 4       = 28 B
//   trainer, master weights:   read g (s), master, m, v; write p (s), master, m, v   2 s + 24 = 28 B
//   trainer, no master:        read p (s), g (s), m, v; write p (s), m, v            3 s + 16 = 22 B
// for a 16-bit type of s = 2 bytes. The trainer's inf/NaN check reads g once more (s bytes per
// parameter, partly from L2), which is overhead and not counted. The fp16/bf16 cases store the
// fused trainer's bytes; PyTorch's AMP step moves more (its check reads and writes g, its update
// writes g back).
//
// One input set, no rotation: an optimizer updates its state in place, so each repetition reads
// what the last one wrote, and the smallest list (swin-t, 28.3M parameters) moves 790 MB a step,
// 16x the L2.
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/adamw.h"
#endif

namespace fusekit::suites {
namespace {

constexpr float kLossScale = 1024;

// The parameter tensors of BERT (HuggingFace BertForPreTraining without its next-sentence head;
// the MLM decoder's weight is tied to the word embeddings, its bias is not).
std::vector<size_t> bert_tensors(size_t hidden, int layers, size_t intermediate) {
  const size_t vocabulary = 30522, positions = 512, token_types = 2;
  std::vector<size_t> sizes = {vocabulary * hidden, positions * hidden, token_types * hidden, hidden, hidden};
  for (int layer = 0; layer < layers; ++layer) {
    for (int projection = 0; projection < 4; ++projection) {  // query, key, value, attention output
      sizes.push_back(hidden * hidden);
      sizes.push_back(hidden);
    }
    sizes.insert(sizes.end(), {hidden, hidden});                                 // attention LayerNorm
    sizes.insert(sizes.end(), {intermediate * hidden, intermediate});            // FFN in
    sizes.insert(sizes.end(), {hidden * intermediate, hidden, hidden, hidden});  // FFN out, LayerNorm
  }
  sizes.insert(sizes.end(), {hidden * hidden, hidden});                  // pooler
  sizes.insert(sizes.end(), {hidden * hidden, hidden, hidden, hidden});  // MLM transform and LayerNorm
  sizes.push_back(vocabulary);                                           // MLM decoder bias
  return sizes;
}

// Swin-T (timm's swin_tiny_patch4_window7_224): patch embedding, 2-2-6-2 blocks of 96-192-384-768
// channels with relative position bias tables of (2 x 7 - 1)^2 entries per head, patch merging
// between the stages, final LayerNorm and the 1000-class head.
std::vector<size_t> swin_t_tensors() {
  size_t channels = 96;
  std::vector<size_t> sizes = {channels * 3 * 4 * 4, channels, channels, channels};
  const int depths[] = {2, 2, 6, 2}, heads[] = {3, 6, 12, 24};
  for (int stage = 0; stage < 4; ++stage) {
    const size_t c = channels;
    for (int block = 0; block < depths[stage]; ++block) {
      sizes.insert(sizes.end(), {c, c, 169 * static_cast<size_t>(heads[stage]), 3 * c * c, 3 * c, c * c, c, c, c,
                                 4 * c * c, 4 * c, 4 * c * c, c});
    }
    if (stage < 3) {
      sizes.insert(sizes.end(), {4 * c, 4 * c, 2 * c * 4 * c});  // patch merging: LayerNorm, reduction
      channels *= 2;
    }
  }
  sizes.insert(sizes.end(), {channels, channels, 1000 * channels, 1000});
  return sizes;
}

std::vector<size_t> tensor_list(const std::string& name) {
  if (name == "bert-base") return bert_tensors(768, 12, 3072);    // 110.1M parameters, 204 tensors
  if (name == "bert-large") return bert_tensors(1024, 24, 4096);  // 336.2M, 396
  if (name == "swin-t") return swin_t_tensors();                  // 28.3M, 173
  throw std::invalid_argument("unknown tensor list '" + name + "': expected bert-base, bert-large or swin-t");
}

kernels::AdamWOptions options() { return {}; }  // torch.optim.AdamW's defaults

// The operands of one case, allocated by setup and freed by release: fp32 tensors at 16-byte
// boundaries of four flat buffers (the fp32 fused case and every baseline), or the trainer.
struct AdamWOperands {
  std::vector<size_t> sizes;
  kernels::FlatLayout layout;
  DeviceBuffer params, grads, exp_avgs, exp_avg_sqs, steps;
  std::unique_ptr<kernels::AdamWTensorList> list;
  int64_t step = 0;
  std::unique_ptr<kernels::AdamWTrainer> trainer;
#ifdef FUSEKIT_WITH_TORCH
  baselines::AdamWTensors tensors;
  std::optional<baselines::GradScalerState> scaler;
#endif

  // fp32 tensors (the fused fp32 case and the baselines).
  AdamWOperands(std::vector<size_t> tensor_sizes, cudaStream_t stream)
      : sizes(std::move(tensor_sizes)), layout(kernels::flat_layout(sizes, 4)) {
    const size_t n = layout.elements, bytes = n * sizeof(float);
    params = DeviceBuffer(bytes);
    grads = DeviceBuffer(bytes);
    exp_avgs = DeviceBuffer(bytes);
    exp_avg_sqs = DeviceBuffer(bytes);
    fill_state(params.get(), grads.get(), exp_avgs.as<float>(), exp_avg_sqs.as<float>(), n, kernels::DType::f32, 1.0f,
               stream);
  }

  // The trainer, with or without master weights.
  AdamWOperands(std::vector<size_t> tensor_sizes, kernels::DType dtype, bool master_weights, cudaStream_t stream)
      : sizes(std::move(tensor_sizes)) {
    trainer = std::make_unique<kernels::AdamWTrainer>(dtype, sizes, master_weights);
    fill_state(trainer->parameters(), trainer->gradients(), trainer->exp_avg(), trainer->exp_avg_sq(),
               trainer->flat_elements(), dtype, kLossScale, stream);
    trainer->load_master_weights(stream);
  }

  // Weights at BERT's initial scale, gradients times the loss scale, and nonzero moments (never time zeros).
  static void fill_state(void* p, void* g, float* m, float* v, size_t n, kernels::DType dtype, float loss_scale,
                         cudaStream_t stream) {
    fill_random(p, n, dtype, 1, 0.02f, 0.0f, stream);
    fill_random(g, n, dtype, 2, loss_scale, 0.0f, stream);
    fill_random(m, n, kernels::DType::f32, 3, 1e-2f, 0.0f, stream);
    fill_random(v, n, kernels::DType::f32, 4, 1e-4f, 1e-4f, stream);  // positive
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  void make_list() {
    std::vector<kernels::AdamWTensor> tensors;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t at = layout.offsets[i];
      tensors.push_back({params.as<float>() + at, grads.as<float>() + at, exp_avgs.as<float>() + at,
                         exp_avg_sqs.as<float>() + at, sizes[i]});
    }
    list = std::make_unique<kernels::AdamWTensorList>(tensors);
  }

#ifdef FUSEKIT_WITH_TORCH
  // Views built once: wrapping 200-400 tensors every repetition would time the host.
  void make_tensors(bool amp, cudaStream_t stream) {
    steps = DeviceBuffer(sizes.size() * sizeof(float));
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(steps.get(), 0, steps.bytes(), stream));
    const auto floats = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t at = layout.offsets[i];
      const std::vector<int64_t> shape = {static_cast<int64_t>(sizes[i])};
      tensors.params.push_back(at::from_blob(params.as<float>() + at, shape, floats));
      tensors.grads.push_back(at::from_blob(grads.as<float>() + at, shape, floats));
      tensors.exp_avgs.push_back(at::from_blob(exp_avgs.as<float>() + at, shape, floats));
      tensors.exp_avg_sqs.push_back(at::from_blob(exp_avg_sqs.as<float>() + at, shape, floats));
      tensors.steps.push_back(at::from_blob(steps.as<float>() + i, {}, floats));
    }
    if (amp) {
      TorchStream on_stream(stream);
      scaler = baselines::make_grad_scaler(1.0, at::kCUDA);
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
#endif
};

double bytes_moved(const std::vector<size_t>& sizes, kernels::DType dtype, bool master_weights = true) {
  double parameters = 0;
  for (size_t size : sizes) parameters += static_cast<double>(size);
  const double s = kernels::dtype_size(dtype);
  const double per_parameter = dtype == kernels::DType::f32 ? 7 * 4 : master_weights ? 2 * s + 6 * 4 : 3 * s + 4 * 4;
  return parameters * per_parameter;
}

std::vector<Case> adamw_cases(const std::string& shape, kernels::DType dtype) {
  const std::vector<size_t> sizes = tensor_list(shape);
  store::CaseInfo info = make_case_info("adamw", shape, dtype, false, bytes_moved(sizes, dtype));
  auto operands = std::make_shared<std::optional<AdamWOperands>>();
  auto release = [operands] { operands->reset(); };
  const bool trainer = dtype != kernels::DType::f32;

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, trainer](cudaStream_t stream, int) {
                     AdamWOperands& o = **operands;
                     if (trainer) {
                       o.trainer->step(options(), kLossScale, stream);
                     } else {
                       kernels::adamw_step(*o.list, options(), ++o.step, stream);
                     }
                   },
                   [operands, sizes, dtype, trainer](cudaStream_t stream) {
                     if (trainer) {
                       operands->emplace(sizes, dtype, /*master_weights=*/true, stream);
                     } else {
                       operands->emplace(sizes, stream).make_list();
                     }
                   },
                   release});
  if (trainer) {
    store::CaseInfo no_master = info;
    no_master.variant = "fused:no-master";
    no_master.bytes = bytes_moved(sizes, dtype, /*master_weights=*/false);
    cases.push_back(
        {no_master, [operands](cudaStream_t stream, int) { (*operands)->trainer->step(options(), kLossScale, stream); },
         [operands, sizes, dtype](cudaStream_t stream) {
           operands->emplace(sizes, dtype, /*master_weights=*/false, stream);
         },
         release});
  }
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, trainer](cudaStream_t stream, int) {
                     AdamWOperands& o = **operands;
                     TorchStream on_stream(stream);
                     const kernels::AdamWOptions k = options();
                     const baselines::AdamWHyperparameters h{k.lr, k.beta1, k.beta2, k.eps, k.weight_decay};
                     if (trainer) {
                       baselines::adamw_fused_amp_step(o.tensors, h, *o.scaler);
                     } else {
                       baselines::adamw_fused_step(o.tensors, h);
                     }
                   },
                   [operands, sizes, trainer](cudaStream_t stream) {
                     operands->emplace(sizes, stream).make_tensors(trainer, stream);
                   },
                   release});
#endif
  return cases;
}

}  // namespace

OpDefinition adamw_op() {
  OpDefinition op;
  op.name = "adamw";
  op.shape_syntax = "bert-base | bert-large | swin-t";
  op.shapes = {"bert-base", "bert-large", "swin-t"};
  op.has_backward = false;
  op.cases = [](const std::string& shape, kernels::DType dtype, bool) { return adamw_cases(shape, dtype); };
  return op;
}

}  // namespace fusekit::suites
