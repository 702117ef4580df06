// The models suite's BERT cases: one whole masked-LM training step (forward, backward, AdamW) per
// repetition, of models/bert_model.h's function, for each config. Direction "fwd" only: a step is
// one case per shape and dtype (as an optimizer step is).
//
//   fused      models/bert_fused.h: fusekit's kernels, memory planned once, fp32 master weights
//   fused:graph the same, each step replayed as a CUDA graph (FusedBert::capture_step_graphs)
//   baseline   baselines/models/bert_baseline.h: libtorch modules, autocast, autograd, AdamW fused
//              (where libtorch is built in)
// Peers (scripts/peers/ops/bert_step.py): Hugging Face's BertForMaskedLM under AMP, eager and
// torch.compile, on the same weights' distribution and the same batches.
//
// Shapes are models/bert_config.h's specs without the dtype: "bert-base:b64:s128". Every variant
// starts from the same random weights (models/bert_init.h, seed 1) and rotates through four batches
// of the synthetic MLM data (models/mlm_data.h, seed 0). The case's flops are the step's matrix
// products (forward x 3: the backward's two products per forward one), attention's included, the
// head's on the masked rows that the fused step computes (the others compute all rows: more work,
// not counted). Bytes: 0 (a step is not a copy). Each variant also stores its peak device memory
// (store::CaseMetric "peak_memory_bytes", below; the peers the same from PyTorch's allocator).
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "models/bert_fused.h"
#include "models/bert_init.h"
#include "models/memory_plan.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#ifdef FUSEKIT_WITH_TORCH
#include <c10/cuda/CUDACachingAllocator.h>

#include "baselines/models/bert_baseline.h"
#include "suites/ops/torch_operands.h"
#endif

namespace fusekit::suites {
namespace {

constexpr int kBatches = 4;

double step_flops(const models::BertConfig& c) {
  const double N = static_cast<double>(c.tokens()), H = c.hidden, I = c.intermediate, S = c.sequence;
  const double M = models::MemoryPlan(c).masked_rows();
  const double per_layer = 2 * N * (4 * H * H + 2 * H * I) + 4 * c.batch * S * S * H;
  const double head = 2 * M * (H * H + H * c.vocab);
  return 3 * (c.layers * per_layer + head);
}

struct StepOperands {
  std::unique_ptr<models::BertMlmModel> model;
  double bytes_before = 0;  // device memory in use before the model was built
};

// The case's "peak_memory_bytes": the device memory the variant holds after its timed steps, over
// what was in use before it was built. The fused step allocates everything when it is built and
// nothing in a step; PyTorch's caching allocator keeps the blocks of a step's peak reserved, so
// after the steps it holds its peak (its cache is emptied before the variant is built, so that the
// cases before it are not counted). What the allocators hold, as nvidia-smi shows it: the number
// that decides whether a batch fits.
std::vector<store::CaseMetric> peak_memory(const StepOperands& o) {
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  return {{"peak_memory_bytes", device_bytes_in_use() - o.bytes_before}};
}

// The cases' initial weights, one model's at a time (suites/ops/operands.h's kept_for).
std::shared_ptr<const models::BertInitialWeights> initial_weights(const models::BertConfig& config) {
  const std::string key = std::to_string(config.layers) + "x" + std::to_string(config.hidden) + "x" +
                          std::to_string(config.heads) + "x" + std::to_string(config.intermediate) + "x" +
                          std::to_string(config.vocab) + "x" + std::to_string(config.max_positions) + "x" +
                          std::to_string(config.token_types) + ":" + models::dtype_spec_name(config.dtype);
  return kept_for<models::BertInitialWeights>(
      key, [&] { return std::make_shared<const models::BertInitialWeights>(config, 1, config.dtype); });
}

std::vector<Case> bert_step_cases(const std::string& shape, kernels::DType dtype) {
  const models::BertConfig config = models::parse_bert_config(shape + ":" + models::dtype_spec_name(dtype));
  store::CaseInfo info = make_case_info("bert_step", shape, dtype, false, 0);
  info.flops = step_flops(config);
  auto operands = std::make_shared<std::optional<StepOperands>>();
  auto release = [operands] { operands->reset(); };
  auto metrics = [operands] { return peak_memory(**operands); };
  auto prepare = [config](models::BertMlmModel& model) {
    model.load_state_dict(initial_weights(config)->tensors());
    models::MlmDataOptions data;
    data.batch = config.batch;
    data.sequence = config.sequence;
    data.vocab = config.vocab;
    std::vector<models::MlmBatch> batches;
    for (int i = 0; i < kBatches; ++i) batches.push_back(models::make_mlm_batch(data, static_cast<uint64_t>(i)));
    model.prepare_batches(batches);
  };
  auto run = [operands](cudaStream_t stream, int rep) { (*operands)->model->enqueue_step(rep % kBatches, stream); };

  std::vector<Case> cases;
  for (const bool graph : {false, true}) {
    info.variant = graph ? "fused:graph" : "fused";
    cases.push_back({info, run,
                     [operands, config, prepare, graph](cudaStream_t) {
                       operands->emplace();
                       (*operands)->bytes_before = device_bytes_in_use();
                       auto model = std::make_unique<models::FusedBert>(config, models::BertTrainOptions{});
                       prepare(*model);
                       if (graph) model->capture_step_graphs();
                       (*operands)->model = std::move(model);
                     },
                     release, metrics});
  }
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands](cudaStream_t stream, int rep) {
                     TorchStream on_stream(stream);
                     (*operands)->model->enqueue_step(rep % kBatches, stream);
                   },
                   [operands, config, prepare](cudaStream_t stream) {
                     TorchStream on_stream(stream);
                     operands->emplace();
                     FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
                     c10::cuda::CUDACachingAllocator::emptyCache();
                     (*operands)->bytes_before = device_bytes_in_use();
                     (*operands)->model = std::make_unique<baselines::BaselineBert>(config, models::BertTrainOptions{},
                                                                                    baselines::BaselinePrecision::amp);
                     prepare(*(*operands)->model);
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

OpDefinition bert_step_op() {
  OpDefinition op;
  op.name = "bert_step";
  op.suite = "models";
  op.shape_syntax = "<bert-base|bert-large|bert-tiny>[:b<batch>][:s<sequence>]";
  op.shapes = {"bert-base:b64:s128", "bert-base:b16:s512", "bert-large:b32:s128", "bert-large:b8:s512"};
  op.has_backward = false;
  op.cases = [](const std::string& shape, kernels::DType dtype, bool) {
    if (dtype == kernels::DType::f32)
      throw std::invalid_argument("bert_step: fp16 or bf16 (the attention kernel is 16-bit)");
    return bert_step_cases(shape, dtype);
  };
  return op;
}

}  // namespace fusekit::suites
