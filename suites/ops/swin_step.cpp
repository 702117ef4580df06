// The models suite's Swin cases: one whole image-classification training step (forward, backward,
// AdamW) per repetition, for Swin-T at batch 128 and Swin-B at batch 64. Direction "fwd" only, as
// bert_step.
//
//   fused      models/swin_fused.h: fusekit's kernels, memory planned once, fp32 master weights
//   fused:graph the same, each step replayed as a CUDA graph (FusedSwin::capture_step_graphs)
//   baseline   baselines/models/swin_baseline.h: libtorch modules in timm's structure, autocast,
//              autograd, AdamW fused=True (where libtorch is found)
// Peers (scripts/peers/ops/swin_step.py): timm's model under AMP, eager and torch.compile, and the
// same model patched by fusekit.torch, eager and compiled.
//
// Shapes are models/swin_config.h's specs without the dtype: "swin-t:b128". Every variant starts
// from random weights of timm's initializer's distribution (models/swin_init.h, seed 1) and rotates
// through two sets of random images and labels (seed 0). The case's flops are the step's matrix
// products (the forward's x 3), window attention's included. Each variant also stores its peak
// device memory ("peak_memory_bytes", as bert_step's).
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "models/swin_config.h"
#include "models/swin_fused.h"
#include "models/swin_init.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#ifdef FUSEKIT_WITH_TORCH
#include <c10/cuda/CUDACachingAllocator.h>

#include "baselines/models/swin_baseline.h"
#include "suites/ops/torch_operands.h"
#endif

namespace fusekit::suites {
namespace {

// 2 (multiply-add) x 3 (forward, and the backward's two products) x the forward's products.
double step_flops(const models::SwinConfig& c) {
  double forward = 0;
  const double patches = static_cast<double>(c.batch) * (c.image_size / c.patch) * (c.image_size / c.patch);
  forward += patches * c.in_channels * c.patch * c.patch * c.embed_dim;  // the patch embedding
  for (int s = 0; s < c.stages(); ++s) {
    const double tokens = static_cast<double>(c.tokens(s)), dim = c.stage_dim(s);
    const double window_tokens = std::min(c.window_tokens(), c.stage_resolution(s) * c.stage_resolution(s));
    const double per_block = tokens * dim * (3 * dim + dim + 2 * c.mlp_ratio * dim)  // qkv, proj, MLP
                             + 2 * tokens * window_tokens * dim;                     // q k^T and p v
    forward += c.depths[s] * per_block;
    if (s + 1 < c.stages()) forward += (tokens / 4) * (4 * dim) * (2 * dim);  // patch merging's reduction
  }
  forward += static_cast<double>(c.batch) * c.features() * c.classes;  // the head
  return 2 * 3 * forward;
}

constexpr int kSets = 2;

struct StepOperands {
  std::unique_ptr<models::FusedSwin> model;
#ifdef FUSEKIT_WITH_TORCH
  std::unique_ptr<baselines::BaselineSwin> baseline;
#endif
  double bytes_before = 0;  // device memory in use before the model was built
};

// As bert_step's: the device memory the variant holds after its timed steps, over what was in
// use before it was built.
std::vector<store::CaseMetric> peak_memory(const StepOperands& o) {
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  return {{"peak_memory_bytes", device_bytes_in_use() - o.bytes_before}};
}

std::vector<models::SwinBatch> random_batches(const models::SwinConfig& c) {
  std::mt19937_64 rng(0);
  std::normal_distribution<float> pixel;
  std::uniform_int_distribution<int64_t> label(0, c.classes - 1);
  std::vector<models::SwinBatch> batches(kSets);
  for (models::SwinBatch& b : batches) {
    b.images.resize(static_cast<size_t>(c.batch) * c.in_channels * c.image_size * c.image_size);
    for (float& v : b.images) v = pixel(rng);
    for (int i = 0; i < c.batch; ++i) b.labels.push_back(label(rng));
  }
  return batches;
}

// A case's initial weights and batches, one config's at a time (suites/ops/operands.h's kept_for).
struct SwinInputs {
  models::SwinInitialWeights weights;
  std::vector<models::SwinBatch> batches;
  explicit SwinInputs(const models::SwinConfig& c) : weights(c, 1, c.dtype), batches(random_batches(c)) {}
};

std::shared_ptr<const SwinInputs> swin_inputs(const std::string& spec, const models::SwinConfig& config) {
  return kept_for<SwinInputs>(spec, [&] { return std::make_shared<const SwinInputs>(config); });
}

std::vector<Case> swin_step_cases(const std::string& shape, kernels::DType dtype) {
  const std::string spec = shape + ":" + models::dtype_spec_name(dtype);
  const models::SwinConfig config = models::parse_swin_config(spec);
  store::CaseInfo info = make_case_info("swin_step", shape, dtype, false, 0);
  info.flops = step_flops(config);
  auto operands = std::make_shared<std::optional<StepOperands>>();
  auto metrics = [operands] { return peak_memory(**operands); };
  std::vector<Case> cases;
  for (const bool graph : {false, true}) {
    info.variant = graph ? "fused:graph" : "fused";
    cases.push_back(
        {info, [operands](cudaStream_t stream, int rep) { (*operands)->model->enqueue_step(rep % kSets, stream); },
         [operands, config, graph, spec](cudaStream_t) {
           operands->emplace();
           (*operands)->bytes_before = device_bytes_in_use();
           (*operands)->model = std::make_unique<models::FusedSwin>(config);
           const std::shared_ptr<const SwinInputs> inputs = swin_inputs(spec, config);
           (*operands)->model->load_state_dict(inputs->weights.tensors());
           (*operands)->model->prepare_batches(inputs->batches);
           if (graph) (*operands)->model->capture_step_graphs();
         },
         [operands] { operands->reset(); }, metrics});
  }
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands](cudaStream_t stream, int rep) {
                     TorchStream on_stream(stream);
                     (*operands)->baseline->enqueue_step(rep % kSets, stream);
                   },
                   [operands, config, spec](cudaStream_t stream) {
                     TorchStream on_stream(stream);
                     operands->emplace();
                     FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
                     c10::cuda::CUDACachingAllocator::emptyCache();
                     (*operands)->bytes_before = device_bytes_in_use();
                     (*operands)->baseline = std::make_unique<baselines::BaselineSwin>(config);
                     const std::shared_ptr<const SwinInputs> inputs = swin_inputs(spec, config);
                     (*operands)->baseline->load_state_dict(inputs->weights.tensors());
                     (*operands)->baseline->prepare_batches(inputs->batches);
                   },
                   [operands] {
                     operands->reset();
                     c10::cuda::CUDACachingAllocator::emptyCache();  // the next case starts from what it needs
                   },
                   metrics});
#endif
  return cases;
}

}  // namespace

OpDefinition swin_step_op() {
  OpDefinition op;
  op.name = "swin_step";
  op.suite = "models";
  op.shape_syntax = "<swin-t|swin-b>[:b<batch>]";
  op.shapes = {"swin-t:b128", "swin-b:b64"};
  op.has_backward = false;
  op.cases = [](const std::string& shape, kernels::DType dtype, bool) {
    if (dtype == kernels::DType::f32) throw std::invalid_argument("swin_step: fp16 or bf16 (the attention is 16-bit)");
    return swin_step_cases(shape, dtype);
  };
  return op;
}

}  // namespace fusekit::suites
